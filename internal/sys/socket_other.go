//go:build !linux

package sys

import (
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func PeerCred(syscall.Conn) (Ucred, error) { return Ucred{}, errdefs.ErrNotSupported }

// NetlinkRoute is the rtnetlink protocol number.
const NetlinkRoute = 0

func ForceSocketBuffers(syscall.RawConn, int) error { return errdefs.ErrNotSupported }

func SetLinkUp(string) error { return errdefs.ErrNotSupported }

func Socketpair(int) ([2]int, error) { return [2]int{-1, -1}, errdefs.ErrNotSupported }
