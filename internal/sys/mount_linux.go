package sys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// MountTmpfs mounts a tmpfs named source on target with the given options
// (e.g. "size=64m,mode=0755"), always nosuid, nodev and noexec. Without the
// privilege to mount it returns an error wrapping errdefs.ErrNotSupported.
func MountTmpfs(source, target, options string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("mounting tmpfs on %s: not root: %w", target, errdefs.ErrNotSupported)
	}
	err := unix.Mount(source, target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, options)
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("mounting tmpfs on %s: %w: %w", target, err, errdefs.ErrNotSupported)
	}
	if err != nil {
		return fmt.Errorf("mounting tmpfs on %s: %w", target, err)
	}
	return nil
}

// Unmount unmounts target, lazily if it is busy. A target that is not a
// mount point, or does not exist, is not an error.
func Unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmounting %s: %w", target, err)
}

// DetachMount lazily unmounts target (MNT_DETACH).
func DetachMount(target string) error {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detaching %s: %w", target, err)
	}
	return nil
}

// IsTmpfsRoot reports whether dir is the root of a tmpfs mount.
func IsTmpfsRoot(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	var sfs unix.Statfs_t
	if unix.Statfs(dir, &sfs) != nil {
		return false
	}
	return st.Dev != parent.Dev && sfs.Type == unix.TMPFS_MAGIC
}

// UsedBytes returns the bytes in use on the file system holding dir.
// FSUsage is what statfs says of a file system.
type FSUsage struct {
	Used, Size, Free int64 // bytes
	FreeInodes       uint64
}

// Full reports whether the file system has no room for another file or
// block worth having (tmpfs leaves a partial page free when writes fail).
func (u FSUsage) Full() bool { return u.Free < 64<<10 || u.FreeInodes == 0 }

// StatFS returns the usage of the file system holding dir.
func StatFS(dir string) (FSUsage, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return FSUsage{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return FSUsage{
		Used: int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize, Size: int64(sfs.Blocks) * sfs.Bsize,
		Free: int64(sfs.Bavail) * sfs.Bsize, FreeInodes: sfs.Ffree,
	}, nil
}

func UsedBytes(dir string) (int64, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize, nil
}
