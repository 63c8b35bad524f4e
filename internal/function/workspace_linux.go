package function

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"golang.org/x/sys/unix"
)

// mountWorkspace mounts a tmpfs of diskMB MiB on dir, so that the cap is
// enforced by the kernel. It returns errdefs.ErrNotSupported (wrapped) when
// the process may not mount (not root, or no CAP_SYS_ADMIN).
func mountWorkspace(dir string, diskMB int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("mounting tmpfs on %s: not root: %w", dir, errdefs.ErrNotSupported)
	}
	err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		fmt.Sprintf("size=%dm,mode=0755", diskMB))
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("mounting tmpfs on %s: %w: %w", dir, err, errdefs.ErrNotSupported)
	}
	if err != nil {
		return fmt.Errorf("mounting tmpfs on %s: %w", dir, err)
	}
	return nil
}

// unmountWorkspace unmounts dir, lazily if it is busy. A dir that is not a
// mount point is not an error.
func unmountWorkspace(dir string) error {
	err := unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(dir, unix.MNT_DETACH)
	}
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmounting %s: %w", dir, err)
}

// isTmpfsMount reports whether dir is the root of a tmpfs mount.
func isTmpfsMount(dir string) bool {
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

// diskUsage returns the bytes used in a workspace.
func diskUsage(dir string, tmpfs bool) (int64, error) {
	if !tmpfs {
		return walkUsage(dir)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize, nil
}
