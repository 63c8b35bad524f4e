package sys

import (
	"errors"
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// EnsureTmpfs mounts a tmpfs named source on dir unless dir already is the
// root of one (from an earlier run). Without the privilege to mount it
// does nothing and reports false: the caller's state then lives on the
// host file system.
func EnsureTmpfs(source, dir, options string) (bool, error) {
	if IsTmpfsRoot(dir) {
		return true, nil
	}
	err := MountTmpfs(source, dir, options)
	if errors.Is(err, errdefs.ErrNotSupported) {
		return false, nil
	}
	return err == nil, err
}

// UnmountTmpfsIfEmpty unmounts the tmpfs at dir if nothing is left in it.
func UnmountTmpfsIfEmpty(dir string) error {
	if !IsTmpfsRoot(dir) {
		return nil
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return err
	}
	return Unmount(dir)
}
