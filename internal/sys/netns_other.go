//go:build !linux

package sys

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// NetlinkRoute is the rtnetlink protocol number.
const NetlinkRoute = 0

func OpenNetns(path string) (*os.File, error) {
	return nil, fmt.Errorf("opening netns %s: %w", path, errdefs.ErrNotSupported)
}

func ProcessNetns() (*os.File, error) { return nil, errdefs.ErrNotSupported }

func NewNetns(func() error) (*os.File, error) { return nil, errdefs.ErrNotSupported }

func InNetns(*os.File, func() error) error { return errdefs.ErrNotSupported }

func BindNetns(*os.File, string) error { return errdefs.ErrNotSupported }

func UnbindNetns(string) error { return nil }

func IsNetnsMount(string) bool { return false }

func EnsureNetnsDir(string) error { return errdefs.ErrNotSupported }

func ForceSocketBuffers(syscall.RawConn, int) error { return errdefs.ErrNotSupported }

// ErrLocked is returned by TryLock when another open file holds the lock.
var ErrLocked = errors.New("locked by another process or handle")

func TryLock(*os.File) error { return errdefs.ErrNotSupported }
