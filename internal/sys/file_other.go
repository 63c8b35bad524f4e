//go:build !linux

package sys

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func CloneFile(dst, src string, perm os.FileMode) (bool, error) {
	return false, fmt.Errorf("cloning %s: %w", src, errdefs.ErrNotSupported)
}

func RenameNoReplace(string, string) error { return errdefs.ErrNotSupported }

func Mknod(string, uint32, uint32, uint32) error { return errdefs.ErrNotSupported }

func CloexecFrom(int) error { return errdefs.ErrNotSupported }

func TryLock(*os.File) error { return errdefs.ErrNotSupported }

// LockFile does nothing off Linux, where nothing it guards is built.
func LockFile(ctx context.Context, path string) (unlock func(), err error) {
	return func() {}, nil
}

func PunchHole(f *os.File, off, n int64) error { return errdefs.ErrNotSupported }

func Allocated(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func AllocatedAt(path string) (int64, time.Time, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, time.Time{}, err
	}
	return fi.Size(), fi.ModTime(), nil
}
