//go:build !linux

package sys

import (
	"os"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func PeerCred(syscall.Conn) (Ucred, error)       { return Ucred{}, errdefs.ErrNotSupported }
func CloexecFrom(int) error                      { return errdefs.ErrNotSupported }
func SetChildSubreaper() error                   { return errdefs.ErrNotSupported }
func SetNotDumpable() error                      { return errdefs.ErrNotSupported }
func OpenPTY() (master, tty *os.File, err error) { return nil, nil, errdefs.ErrNotSupported }
func SetWinsize(*os.File, uint16, uint16) error  { return errdefs.ErrNotSupported }

func ThreadCPUs() ([]int, error) { return nil, errdefs.ErrNotSupported }
func SetThreadCPUs([]int) error  { return errdefs.ErrNotSupported }
func UnpinThreads() error        { return errdefs.ErrNotSupported }
