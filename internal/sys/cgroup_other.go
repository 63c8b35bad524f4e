//go:build !linux

package sys

import (
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func CgroupID(string) (uint64, error) { return 0, errdefs.ErrNotSupported }
func IsBusy(error) bool               { return false }

// Pidfd refers to one process (Linux only).
type Pidfd struct{}

func OpenPidfd(int) (*Pidfd, error) { return nil, errdefs.ErrNotSupported }
func (*Pidfd) Kill() error          { return errdefs.ErrNotSupported }
func (*Pidfd) Close() error         { return nil }
func PidfdFromFD(int) *Pidfd        { return nil }
func (*Pidfd) Fd() int              { return -1 }
func (*Pidfd) Wait(time.Duration) error {
	return errdefs.ErrNotSupported
}

func WaitModified(*os.File, time.Duration) error { return errdefs.ErrNotSupported }
