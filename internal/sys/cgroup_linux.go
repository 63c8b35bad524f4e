package sys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupID returns the id of the cgroup2 directory at path: the value
// bpf_get_current_cgroup_id() returns for a task in it. It is read from
// the directory's kernfs file handle, which carries the 64-bit id (as
// libbpf and cilium/ebpf do), not from stat, so callers can check one
// against the other.
func CgroupID(path string) (uint64, error) {
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, path, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the cgroup id of %s: %w", path, err)
	}
	b := h.Bytes()
	if len(b) < 8 {
		return 0, fmt.Errorf("reading the cgroup id of %s: %d-byte file handle", path, len(b))
	}
	return binary.NativeEndian.Uint64(b[:8]), nil
}

// IsBusy reports whether err is EBUSY (a cgroup that still has tasks or
// children cannot be removed).
func IsBusy(err error) bool { return errors.Is(err, unix.EBUSY) }

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

// WaitModified waits up to timeout for a kernfs file open as f (a
// cgroup's cgroup.events) to change after it was last read: kernfs wakes
// pollers with POLLPRI on every notification. A timeout is not an error;
// callers re-read either way.
func WaitModified(f *os.File, timeout time.Duration) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = sc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
		for {
			ts := unix.NsecToTimespec(timeout.Nanoseconds())
			_, perr = unix.Ppoll(fds, &ts, nil)
			if !errors.Is(perr, unix.EINTR) {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return perr
}
