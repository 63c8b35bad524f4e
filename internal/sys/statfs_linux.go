package sys

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

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

// UsedBytes returns the bytes in use on the file system holding dir.
func UsedBytes(dir string) (int64, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize, nil
}

// IsNoSpace reports whether err is a full disk or an exhausted quota
// (ENOSPC, EDQUOT).
func IsNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// FSType is the type (statfs f_type, a magic number) of the file system
// holding path.
func FSType(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Type), nil
}
