package sys

import (
	"errors"
	"fmt"
	"io"
	"os"

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
