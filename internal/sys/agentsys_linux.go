package sys

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// PeerCred returns the credentials of the process at the other end of a
// connected Unix socket (SO_PEERCRED, recorded by the kernel at connect
// time and translated into this process's namespaces when asked).
func PeerCred(c syscall.Conn) (Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Ucred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		uc   *unix.Ucred
		uerr error
	)
	if err := rc.Control(func(fd uintptr) {
		uc, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Ucred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if uerr != nil {
		return Ucred{}, fmt.Errorf("peer credentials: %w", uerr)
	}
	return Ucred{Pid: uc.Pid, Uid: uc.Uid, Gid: uc.Gid}, nil
}

// CloexecFrom marks every file descriptor from first up close-on-exec
// (close_range(2) with CLOSE_RANGE_CLOEXEC, Linux 5.11), so that none of
// them, whatever opened it, reaches a program this process starts.
func CloexecFrom(first int) error {
	if err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("marking descriptors close-on-exec: %w", err)
	}
	return nil
}

// SetChildSubreaper makes this process the reaper of its orphaned
// descendants, as PID 1 is (PR_SET_CHILD_SUBREAPER).
func SetChildSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("becoming a child subreaper: %w", err)
	}
	return nil
}

// SetNotDumpable clears this process's dumpable flag (PR_SET_DUMPABLE 0):
// no core dumps, and processes without CAP_SYS_PTRACE over its user
// namespace can neither ptrace it nor read its /proc/PID/mem. Programs it
// starts get the flag back at execve.
func SetNotDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the dumpable flag: %w", err)
	}
	return nil
}

// OpenPTY opens a new pseudo-terminal pair from /dev/ptmx. The master is
// non-blocking and registered with Go's poller (read deadlines and Close
// interrupt a blocked Read); the terminal (slave) is opened O_NOCTTY and
// is meant to be handed to a child. Both are close-on-exec.
func OpenPTY() (master, tty *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	rc, err := master.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	var (
		n    uint32
		ierr error
	)
	if err := rc.Control(func(fd uintptr) {
		if ierr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ierr != nil {
			return
		}
		n, ierr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
	}); err != nil {
		return nil, nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	if ierr != nil {
		return nil, nil, fmt.Errorf("unlocking a pseudo-terminal: %w", ierr)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	tty, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return master, tty, nil
}

// SetWinsize sets the window size of the terminal f (either side of a
// pseudo-terminal) without changing f's blocking mode.
func SetWinsize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("resizing a terminal: %w", err)
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return fmt.Errorf("resizing a terminal: %w", err)
	}
	if ierr != nil {
		return fmt.Errorf("resizing a terminal: %w", ierr)
	}
	return nil
}
