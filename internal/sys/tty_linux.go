package sys

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

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
