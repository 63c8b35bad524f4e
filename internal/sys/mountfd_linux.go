package sys

import (
	"errors"
	"fmt"
	"os"
	"strings"

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

// beneath resolves a path below a directory, following no symlink and
// crossing no mount.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openRoot opens the calling thread's root directory.
func openRoot() (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the root: %w", err)
	}
	return fd, nil
}

// setRootReadOnly makes the mount at the calling thread's root read-only
// or writable (that mount only, not those under it). A mount with a file
// open for writing cannot become read-only (EBUSY).
func setRootReadOnly(ro bool) error {
	attr := &unix.MountAttr{}
	if ro {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	} else {
		attr.Attr_clr = unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", 0, attr); err != nil {
		return fmt.Errorf("setting / read-only=%v: %w", ro, err)
	}
	return nil
}

// SetMountReadOnly makes the mount whose root is path (absolute, in the
// calling thread's root, such as /dev/shm) read-only or writable, that
// mount only. The path is resolved without following any symlink; it
// may cross mounts (that is how it reaches one), and must end at a
// mount's root (else EINVAL). A mount with a file open for writing
// cannot become read-only (EBUSY).
func SetMountReadOnly(path string, ro bool) error {
	root, err := openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(root, strings.TrimLeft(path, "/"), how)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{}
	if ro {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	} else {
		attr.Attr_clr = unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("setting %s read-only=%v: %w", path, ro, err)
	}
	return nil
}

// BindWritable makes path (absolute, in the calling thread's root) a
// writable mount of itself on top of the root mount, so that it stays
// writable when the root is made read-only. The path is resolved from
// the root without following any symlink and without leaving the root
// mount: a sandbox cannot point it elsewhere. A missing last component is
// made as a directory owned by uid:gid.
func BindWritable(path string, uid, gid int) error {
	rel := strings.TrimLeft(path, "/")
	if rel == "" {
		return errors.New("the root is not a bind target")
	}
	root, err := openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: beneath}
	fd, err := unix.Openat2(root, rel, how)
	if errors.Is(err, unix.ENOENT) {
		parent, name := ".", rel
		if i := strings.LastIndexByte(rel, '/'); i >= 0 {
			parent, name = rel[:i], rel[i+1:]
		}
		pfd, perr := unix.Openat2(root, parent, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
		if perr != nil {
			return fmt.Errorf("%s: %w", parent, perr)
		}
		// O_PATH descriptors cannot make entries: reopen the directory.
		dfd, derr := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		unix.Close(pfd)
		if derr != nil {
			return fmt.Errorf("%s: %w", parent, derr)
		}
		merr := unix.Mkdirat(dfd, name, 0o755)
		if merr == nil {
			merr = unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		unix.Close(dfd)
		if merr != nil && !errors.Is(merr, unix.EEXIST) {
			return fmt.Errorf("making %s: %w", path, merr)
		}
		fd, err = unix.Openat2(root, rel, how)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(fd)
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("cloning %s: %w", path, err)
	}
	defer unix.Close(tree)
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("making %s writable: %w", path, err)
	}
	if err := unix.MoveMount(tree, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("binding %s: %w", path, err)
	}
	return nil
}

// checkBindable reports whether BindWritable could bind path: it, or its
// parent if it is missing, resolves from the root without symlinks and
// without leaving the root mount.
func checkBindable(path string) error {
	rel := strings.TrimLeft(path, "/")
	if rel == "" {
		return errors.New("the root is not a bind target")
	}
	root, err := openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: beneath})
	if errors.Is(err, unix.ENOENT) {
		parent := "."
		if i := strings.LastIndexByte(rel, '/'); i >= 0 {
			parent = rel[:i]
		}
		fd, err = unix.Openat2(root, parent, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return unix.Close(fd)
}

// unmountPath detaches the mount at path (absolute, in the calling
// thread's root), not following a symlink there; nothing mounted is not
// an error.
func unmountPath(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmounting %s: %w", path, err)
}

// ReplaceWritable replaces the writable binds of old with those of
// writable, in the calling thread's root. Either list nil, or naming
// "/", leaves the whole root writable (no binds); otherwise the root is
// made read-only and each path a writable bind of itself (BindWritable,
// missing directories made for uid:gid). The old binds go first, so the
// new paths are checked without them (the same path is a mount point
// while bound, and a path under a bind would cross it). A new path that
// does not check puts the old binds back and returns an
// *UnbindableError; any other failure leaves the root read-only with
// nothing bound (fail closed) and returns it.
func ReplaceWritable(old, writable []string, uid, gid int) error {
	for _, w := range old {
		if w != "/" {
			if err := unmountPath(w); err != nil {
				return failClosed(old, err)
			}
		}
	}
	if !wholeRoot(writable) {
		for _, w := range writable {
			if err := checkBindable(w); err != nil {
				if rerr := bindAll(old, uid, gid); rerr != nil {
					return failClosed(old, rerr)
				}
				return &UnbindableError{Path: w, Err: err}
			}
		}
	}
	if err := bindAll(writable, uid, gid); err != nil {
		return failClosed(writable, err)
	}
	return nil
}

// wholeRoot reports whether writable leaves the whole root writable.
func wholeRoot(writable []string) bool {
	if writable == nil {
		return true
	}
	for _, w := range writable {
		if w == "/" {
			return true
		}
	}
	return false
}

// bindAll makes the root writable, then, unless writable leaves all of
// it so, binds each path writable and makes the root read-only.
func bindAll(writable []string, uid, gid int) error {
	if err := setRootReadOnly(false); err != nil {
		return err
	}
	if wholeRoot(writable) {
		return nil
	}
	for _, w := range writable {
		if err := BindWritable(w, uid, gid); err != nil {
			return err
		}
	}
	return setRootReadOnly(true)
}

// failClosed unbinds binds and makes the root read-only, and returns err.
func failClosed(binds []string, err error) error {
	for _, w := range binds {
		if w != "/" {
			_ = unmountPath(w)
		}
	}
	_ = setRootReadOnly(true)
	return err
}
