package sys

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Pidfd refers to one process for its whole life: signals sent through it
// can never reach a later process that reuses the pid.
type Pidfd struct{ fd int }

// OpenPidfd opens a pidfd for pid. It fails with an error wrapping
// fs.ErrNotExist (ESRCH) if the process is gone.
func OpenPidfd(pid int) (*Pidfd, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("opening a pidfd for %d: %w: %w", pid, err, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("opening a pidfd for %d: %w", pid, err)
	}
	return &Pidfd{fd: fd}, nil
}

// Kill sends SIGKILL. A process that already exited is not an error.
// The methods of a nil *Pidfd do nothing.
func (p *Pidfd) Kill() error {
	if p == nil {
		return nil
	}
	err := unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("killing through a pidfd: %w", err)
	}
	return nil
}

// Close releases the pidfd.
func (p *Pidfd) Close() error {
	if p == nil {
		return nil
	}
	return unix.Close(p.fd)
}

// Fd is the pidfd's descriptor (to pass it on: the Pidfd keeps it).
func (p *Pidfd) Fd() int { return p.fd }

// PidfdFromFD takes over fd, a pidfd (one received from another
// process, or made by clone's CLONE_PIDFD).
func PidfdFromFD(fd int) *Pidfd { return &Pidfd{fd: fd} }

// Wait waits up to timeout for the process to exit (a pidfd becomes
// readable then). It returns an error wrapping os.ErrDeadlineExceeded
// if the process still runs.
func (p *Pidfd) Wait(timeout time.Duration) error {
	if p == nil {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		ms := max(int(time.Until(deadline)/time.Millisecond), 0)
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("waiting on a pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("the process still runs after %s: %w", timeout, os.ErrDeadlineExceeded)
		}
	}
}

// ExitWatch notices the end of one process, which need not be a child of
// ours: a pidfd (it can never refer to a later process reusing the pid)
// registered with the Go runtime's poller, so a waiting goroutine holds
// no thread, and the end is seen as soon as the kernel reports it. Its
// methods may be called concurrently.
type ExitWatch struct {
	f      *os.File
	pid    int
	closed atomic.Bool
}

// WatchExit watches process pid. It fails with an error wrapping
// fs.ErrNotExist if the process is gone already.
func WatchExit(pid int) (*ExitWatch, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("watching process %d: %w: %w", pid, err, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("watching process %d: %w", pid, err)
	}
	// Non-blocking, the descriptor goes to the poller.
	return &ExitWatch{f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)), pid: pid}, nil
}

// Wait returns nil once the process has exited, or an error wrapping
// fs.ErrClosed if Close was called first.
func (w *ExitWatch) Wait() error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		// A pidfd reads ready once its process has exited; the poller
		// may wake us for less.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			return false
		}
		perr = err
		return err != nil || n > 0
	})
	if err != nil {
		if w.closed.Load() {
			return fmt.Errorf("watching process %d: %w", w.pid, fs.ErrClosed)
		}
		return err
	}
	return perr
}

// Status returns how the process ended, as a wait status, once it has
// exited and been reaped. ok is false where the kernel cannot tell
// (before Linux 6.15, PIDFD_INFO_EXIT) or does not know yet.
func (w *ExitWatch) Status() (ws syscall.WaitStatus, ok bool) {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info unix.PidfdInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info.Mask = unix.PIDFD_INFO_EXIT
		ierr = unix.IoctlPidfdInfo(int(fd), &info)
	}); err != nil || ierr != nil || info.Mask&unix.PIDFD_INFO_EXIT == 0 {
		return 0, false
	}
	return syscall.WaitStatus(info.Exit_code), true
}

// Pid is the process's id.
func (w *ExitWatch) Pid() int { return w.pid }

// Close releases the pidfd and ends a Wait in progress.
func (w *ExitWatch) Close() error {
	w.closed.Store(true)
	return w.f.Close()
}
