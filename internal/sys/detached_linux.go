package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// CloneMount returns a detached copy of the mount at path (open_tree with
// OPEN_TREE_CLONE): a mount in no namespace's table, kept alive by the
// descriptor, which MoveMount attaches elsewhere, in another mount
// namespace too. Sandbox roots travel this way so that the host's mount
// table, which every new mount namespace copies, does not grow with them.
func CloneMount(path string) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("cloning the mount at %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// MoveMount attaches the detached mount fd (from CloneMount) at target.
func MoveMount(fd int, target string) error {
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching a mount at %s: %w", target, err)
	}
	return nil
}
