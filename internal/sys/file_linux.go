package sys

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CloneFile makes dst (created, or truncated, with mode perm) a copy of
// the regular file src that shares src's storage where it can: a reflink
// (FICLONE) when the file system has them (btrfs, XFS), else a sparse
// copy that writes only src's data extents (SEEK_DATA, SEEK_HOLE, each
// extent by copy_file_range) and leaves its holes holes. It reports
// whether it cloned. On error dst is removed.
func CloneFile(dst, src string, perm os.FileMode) (cloned bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return true, nil
	}
	fi, err := in.Stat()
	if err != nil {
		return false, err
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return false, err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole up to the end
		}
		if err != nil {
			return false, fmt.Errorf("seeking data in %s: %w", src, err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return false, fmt.Errorf("seeking a hole in %s: %w", src, err)
		}
		if err := copyRange(out, in, data, hole-data); err != nil {
			return false, fmt.Errorf("copying %s: %w", src, err)
		}
		off = hole
	}
	return false, nil
}

// copyRange copies n bytes at off from in to out, at the same offset.
func copyRange(out, in *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
			_, err := io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
			return err
		}
		if err != nil {
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		off, n = off+int64(c), n-int64(c)
	}
	return nil
}

// RenameNoReplace renames from to to, failing (EEXIST) if to exists,
// even as an empty directory (which rename(2) would replace).
func RenameNoReplace(from, to string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// Mknod creates a special file (device node, FIFO or socket) at path;
// mode carries the type bits (S_IFCHR…) and the permissions.
func Mknod(path string, mode uint32, major, minor uint32) error {
	if err := unix.Mknod(path, mode, int(unix.Mkdev(major, minor))); err != nil {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	return nil
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

// TryLock takes an exclusive advisory lock (flock) on f without waiting.
// It is released when f is closed.
func TryLock(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("locking %s: %w", f.Name(), ErrLocked)
	}
	if err != nil {
		return fmt.Errorf("locking %s: %w", f.Name(), err)
	}
	return nil
}

// LockFile takes an exclusive flock on path (created if missing),
// waiting for it until ctx ends, and returns the function that releases
// it. The lock is per open file, so it also excludes other goroutines of
// this process. Caches that several processes fill (built-in layers, the
// VM kernel) serialise their builders with it.
func LockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := TryLock(f)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, ErrLocked) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Lock takes an exclusive advisory lock (flock) on f, waiting for it.
// It is released when f is closed.
func Lock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX) }

// CloseOnExec marks fd close-on-exec.
func CloseOnExec(fd int) { unix.CloseOnExec(fd) }

// HasCloseOnExec reports whether fd is marked close-on-exec; it fails
// (EBADF) if fd is not open.
func HasCloseOnExec(fd int) (bool, error) {
	flags, _, e := unix.RawSyscall(unix.SYS_FCNTL, uintptr(fd), unix.F_GETFD, 0)
	if e != 0 {
		return false, e
	}
	return flags&unix.FD_CLOEXEC != 0, nil
}

// PunchHole frees the blocks of f's bytes [off, off+n) (they read back as
// zeros), keeping its size.
func PunchHole(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// Allocated returns the bytes of disk f's blocks take.
func Allocated(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}

// AllocatedAt returns the bytes of disk the file at path takes, and its
// modification time.
func AllocatedAt(path string) (int64, time.Time, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, time.Time{}, err
	}
	return st.Blocks * 512, time.Unix(st.Mtim.Unix()), nil
}
