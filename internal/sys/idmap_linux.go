package sys

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// IDMappedClone mounts at target a clone of the mount at source whose
// file owners are shifted by the user namespace open as usernsFd: files
// owned by uid 0 show as the uid that namespace maps 0 to, and so on
// (open_tree(OPEN_TREE_CLONE) + mount_setattr(MOUNT_ATTR_IDMAP) +
// move_mount). The clone shares source's superblock, hence its page cache.
func IDMappedClone(source, target string, usernsFd int) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cloning mount %s: %w", source, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(usernsFd)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("id-mapping mount %s: %w", source, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("placing id-mapped mount on %s: %w", target, err)
	}
	return nil
}
