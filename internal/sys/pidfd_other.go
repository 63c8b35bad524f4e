//go:build !linux

package sys

import (
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Pidfd refers to one process (Linux only).
type Pidfd struct{}

func OpenPidfd(int) (*Pidfd, error) { return nil, errdefs.ErrNotSupported }

func (*Pidfd) Kill() error { return errdefs.ErrNotSupported }

func (*Pidfd) Close() error { return nil }

func PidfdFromFD(int) *Pidfd { return nil }

func (*Pidfd) Fd() int { return -1 }

func (*Pidfd) Wait(time.Duration) error {
	return errdefs.ErrNotSupported
}

// ExitWatch notices the end of one process (Linux only).
type ExitWatch struct{}

func WatchExit(int) (*ExitWatch, error) { return nil, errdefs.ErrNotSupported }

func (*ExitWatch) Wait() error { return errdefs.ErrNotSupported }

func (*ExitWatch) Status() (ws syscall.WaitStatus, ok bool) { return 0, false }

func (*ExitWatch) Pid() int { return 0 }

func (*ExitWatch) Close() error { return nil }
