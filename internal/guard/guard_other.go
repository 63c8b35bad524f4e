//go:build !(linux && amd64)

package guard

import (
	"net/netip"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Guard needs Linux on x86_64 (its programs are built for it).
type Guard struct{}

var DefaultDeny []netip.Prefix

func Attach(string, Options) (*Guard, error) { return nil, errdefs.ErrNotSupported }

func (*Guard) Close() error { return nil }

func (*Guard) Keep() error { return nil }

func Remove(string) error { return nil }

func ProgramNames() []string { return nil }

func Attached(string) ([]string, error) { return nil, errdefs.ErrNotSupported }
