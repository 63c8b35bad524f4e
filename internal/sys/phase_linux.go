package sys

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// InMountNS runs fn on a fresh thread that has joined the mount
// namespace ns (an open /proc/<pid>/ns/mnt): its root and working
// directory are that namespace's root. The thread never returns to the
// node's namespace: it exits with its goroutine.
func InMountNS(ns *os.File, fn func() error) error {
	var err error
	onSideThread(func() bool {
		// Go's threads share one fs_struct; setns(CLONE_NEWNS) needs
		// this thread to have its own.
		if err = unix.Unshare(unix.CLONE_FS); err != nil {
			err = fmt.Errorf("unsharing the thread's fs: %w", err)
			return false
		}
		if err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			err = fmt.Errorf("joining a mount namespace: %w", err)
			return false
		}
		err = fn()
		return false // the thread stays in the sandbox's namespace: it goes
	})
	return err
}

// onSideThread runs fn on a goroutine locked to an OS thread that is not
// the main one (whose namespaces /proc/self shows for the whole process)
// and waits for it. If fn returns false, the thread has been changed for
// good: it stays locked and exits with the goroutine.
func onSideThread(fn func() (clean bool)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Holding the main thread, start again: the next goroutine
			// lands elsewhere.
			onSideThread(fn)
			runtime.UnlockOSThread()
			return
		}
		if fn() {
			runtime.UnlockOSThread()
		}
	}()
	<-done
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

// SetRootReadOnly makes the mount at the calling thread's root read-only
// or writable (that mount only, not those under it). A mount with a file
// open for writing cannot become read-only (EBUSY).
func SetRootReadOnly(ro bool) error {
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

// CheckBindable reports whether BindWritable could bind path: it, or its
// parent if it is missing, resolves from the root without symlinks and
// without leaving the root mount.
func CheckBindable(path string) error {
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

// UnmountPath detaches the mount at path (absolute, in the calling
// thread's root), not following a symlink there; nothing mounted is not
// an error.
func UnmountPath(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmounting %s: %w", path, err)
}

// UnbindableError is ReplaceWritable's error for a new writable path
// that cannot be bound (see CheckBindable); the earlier binds are back.
type UnbindableError struct {
	Path string
	Err  error
}

func (e *UnbindableError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *UnbindableError) Unwrap() error { return e.Err }

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
			if err := UnmountPath(w); err != nil {
				return failClosed(old, err)
			}
		}
	}
	if !wholeRoot(writable) {
		for _, w := range writable {
			if err := CheckBindable(w); err != nil {
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
	if err := SetRootReadOnly(false); err != nil {
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
	return SetRootReadOnly(true)
}

// failClosed unbinds binds and makes the root read-only, and returns err.
func failClosed(binds []string, err error) error {
	for _, w := range binds {
		if w != "/" {
			_ = UnmountPath(w)
		}
	}
	_ = SetRootReadOnly(true)
	return err
}
