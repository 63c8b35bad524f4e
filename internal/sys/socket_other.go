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

// Socketpair: without SOCK_CLOEXEC here, the pair is marked
// close-on-exec under syscall.ForkLock, so no fork sees it unmarked.
func Socketpair(typ int) ([2]int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, typ, 0)
	if err != nil {
		return fds, err
	}
	syscall.CloseOnExec(fds[0])
	syscall.CloseOnExec(fds[1])
	return fds, nil
}
