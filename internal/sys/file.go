package sys

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// WriteSmallFile writes b to a regular file at path in three system
// calls (open, write, close), failing if the file exists when excl is
// set and truncating it otherwise. os.WriteFile takes eight: os.OpenFile
// tries to add every file to the network poller (two fcntl calls, a
// refused epoll_ctl, two more fcntl calls to undo it), which on a hot
// path — state files written on every create — counts.
func WriteSmallFile(path string, b []byte, perm uint32, excl bool) error {
	flags := syscall.O_WRONLY | syscall.O_CREAT | syscall.O_CLOEXEC
	if excl {
		flags |= syscall.O_EXCL
	} else {
		flags |= syscall.O_TRUNC
	}
	fd, err := openRetry(path, flags, perm)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			syscall.Close(fd)
			return fmt.Errorf("write %s: %w", path, err)
		}
		b = b[n:]
	}
	if err := syscall.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}

func openRetry(path string, flags int, perm uint32) (int, error) {
	for {
		fd, err := syscall.Open(path, flags, perm)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

// ErrLocked is returned by TryLock when another open file holds the lock.
var ErrLocked = errors.New("locked by another process or handle")

// Mode bits for Mknod.
const (
	ModeChar  = unix.S_IFCHR
	ModeBlock = unix.S_IFBLK
	ModeFifo  = unix.S_IFIFO
)

// CloseFd closes a raw file descriptor.
func CloseFd(fd int) error { return syscall.Close(fd) }

// Rmdir removes the empty directory path: one rmdir(2), where os.Remove
// tries unlink(2) first.
func Rmdir(path string) error { return syscall.Rmdir(path) }

// Unlink removes the file (not directory) path: one unlink(2).
func Unlink(path string) error { return syscall.Unlink(path) }

// Stat is stat(2), with the kernel's fields as they are (os.Stat's
// FileInfo hides some behind Sys()).
func Stat(path string, st *syscall.Stat_t) error { return syscall.Stat(path, st) }

// Umask sets this process's file mode creation mask and returns the old
// one.
func Umask(mask int) (old int) { return syscall.Umask(mask) }
