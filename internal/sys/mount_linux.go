package sys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"golang.org/x/sys/unix"
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

// MountErofs mounts the EROFS metadata image meta on target, read-only,
// nosuid and nodev, with blob as its extra device. It is a direct
// mount(2) of the file: no loop device (util-linux mount would add one).
func MountErofs(meta, blob, target string) error {
	erofsMu.Lock()
	defer erofsMu.Unlock()
	return mountErofs(meta, blob, target)
}

// erofsMu serializes this process's EROFS mounts, so that the
// backing-device info a mount adds can be told apart (MountErofsReadahead).
var erofsMu sync.Mutex

// MountErofsReadahead is MountErofs with the mount's readahead set to kb
// KiB: for a data blob whose every read is a round trip to user space
// (a FUSE file), fewer and larger reads. A file-backed EROFS mount gets
// its own backing-device info, /sys/class/bdi/erofs-<n>, named from a
// counter; it is found as the one that appeared with the mount. If
// another process mounted an EROFS at the same moment it cannot be told,
// and the readahead is left as it is: tuned is then false.
func MountErofsReadahead(meta, blob, target string, kb int) (tuned bool, err error) {
	erofsMu.Lock()
	defer erofsMu.Unlock()
	before := erofsBDIs()
	if err := mountErofs(meta, blob, target); err != nil {
		return false, err
	}
	var added []string
	for name := range erofsBDIs() {
		if !before[name] {
			added = append(added, name)
		}
	}
	if len(added) != 1 {
		return false, nil
	}
	p := filepath.Join("/sys/class/bdi", added[0], "read_ahead_kb")
	if err := os.WriteFile(p, []byte(strconv.Itoa(kb)), 0); err != nil {
		return false, fmt.Errorf("setting the readahead of erofs %s: %w", target, err)
	}
	return true, nil
}

// erofsBDIs returns the names of the EROFS backing-device infos.
func erofsBDIs() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/sys/class/bdi")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "erofs-") {
			out[e.Name()] = true
		}
	}
	return out
}

func mountErofs(meta, blob, target string) error {
	opts := ""
	if blob != "" {
		opts = "device=" + blob
	}
	if err := unix.Mount(meta, target, "erofs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting erofs %s on %s: %w", meta, target, err)
	}
	return nil
}

// MountOverlay mounts an overlay on target. lowers are listed top first.
// With upper empty the overlay is read-only; otherwise upper and work
// (on the same file system) take the writes. Always nosuid and nodev.
func MountOverlay(target string, lowers []string, upper, work string) error {
	for _, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return fmt.Errorf("overlay lower %q contains ':' or ','", l)
		}
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	} else {
		flags |= unix.MS_RDONLY
		if len(lowers) == 1 {
			// overlay needs two lowers without an upper; a single read-only
			// layer is served by its own mount instead.
			return fmt.Errorf("a read-only overlay needs at least two lowers")
		}
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mounting overlay on %s: %w", target, err)
	}
	return nil
}

// MountOverlayByFD is MountOverlay (with an upper), but the directories
// reach the kernel as /proc/self/fd/N of descriptors open for the call.
// The kernel keeps an overlay's options as they were given and shows
// them in /proc/<pid>/mountinfo to every process that sees the mount:
// given as paths, a sandbox's root showed the node's data directory to
// the sandbox (the layer cache's and the state directory's paths).
func MountOverlayByFD(target string, lowers []string, upper, work string) error {
	var names []string
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, d := range append(append([]string{}, lowers...), upper, work) {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mounting overlay on %s: opening %s: %w", target, d, err)
		}
		fds = append(fds, fd)
		names = append(names, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	n := len(lowers)
	return MountOverlay(target, names[:n], names[n], names[n+1])
}

// MountFUSE mounts a FUSE file system at dir and returns its /dev/fuse
// connection, non-blocking (reads wait in Go's poller, so Close ends a
// pending Read). The caller serves the protocol, starting with the
// kernel's INIT request; closing the connection aborts the file system
// (every request waiting on it fails), and DetachMount removes it.
func MountFUSE(dir, subtype string) (*os.File, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/fuse: %w", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := unix.Mount(subtype, dir, "fuse."+subtype, unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mounting fuse at %s: %w", dir, err)
	}
	return os.NewFile(uintptr(fd), "/dev/fuse"), nil
}

// MountFUSEConn mounts a read-only FUSE file system of type fuse.<name> at
// dir (nosuid, nodev, noexec; the kernel checks permissions from the
// modes the server reports, default_permissions) with the extra mount
// options given (e.g. "max_read=1048576"), and returns its /dev/fuse
// connection as a blocking, close-on-exec descriptor: for FUSE libraries
// that take a descriptor and read it with read(2) themselves (go-fuse's
// "/dev/fd/N" mount point), which then own it. (go-fuse's own direct
// mount leaves its descriptor open across exec, so every program this
// process started would hold the connection.) The caller serves the
// protocol, starting with the kernel's INIT request; UnmountFUSE removes
// the mount.
func MountFUSEConn(dir, name, options string) (int, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening /dev/fuse: %w", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d,default_permissions", fd, os.Geteuid(), os.Getegid())
	if options != "" {
		opts += "," + options
	}
	flags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount(name, dir, "fuse."+name, flags, opts); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mounting fuse at %s: %w", dir, err)
	}
	return fd, nil
}

// PollFUSEOnce opens the file name of the FUSE mount at dir and polls it
// once, so that the kernel sends the server its first POLL request now,
// which the server answers "not implemented" and the kernel then never
// sends again. A later poll of a file there would otherwise be its
// first: Go's runtime adds every file it opens to its epoll set, and a
// process that opens a file of a FUSE mount it serves itself could block
// in that epoll_ctl until a thread is free to answer (go-fuse, mounted
// through a descriptor, skips its own such "poll hack"; its file name
// is the hack's). Raw open and poll, not os.Open: no epoll here.
func PollFUSEOnce(dir, name string) error {
	fd, err := unix.Open(filepath.Join(dir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s for the first poll: %w", name, err)
	}
	defer unix.Close(fd)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0) // the answer does not matter
	return nil
}

// UnmountFUSE unmounts the FUSE file system at target. If it is busy (a
// file on it is open, such as the device of a file-backed EROFS mount),
// it forces the unmount, which aborts the FUSE connection (every request
// waiting on it, and every later one, fails), and detaches the mount;
// forced reports that it had to. A target that is not a mount point, or
// does not exist, is not an error.
func UnmountFUSE(target string) (forced bool, err error) {
	err = unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		forced = true
		err = unix.Unmount(target, unix.MNT_FORCE) // aborts the connection even when still busy
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(target, unix.MNT_DETACH)
		}
	}
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return forced, nil
	}
	return forced, fmt.Errorf("unmounting %s: %w", target, err)
}

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

// Mount is mount(2) itself, for the sandbox and VM guests' own trees,
// where each mount's source, type, flags (syscall.MS_*) and options are
// the caller's to choose.
func Mount(source, target, fstype string, flags uintptr, data string) error {
	return unix.Mount(source, target, fstype, flags, data)
}

// PivotRoot makes dir, a mount point, the root of the calling thread
// (of every thread that shares its fs, as a fresh process's do) and its
// working directory, and detaches the old root: pivot_root(".", ".")
// stacks the old root on the new one; detaching it leaves only the new.
func PivotRoot(dir string) error {
	if err := unix.Chdir(dir); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	return unix.Chdir("/")
}

// SwitchRoot makes root the process's / as switch_root(8) does: an
// initramfs's rootfs cannot be pivot_root'ed away, so root is moved over
// / and the process chroots into it. The initramfs's files stay in
// memory, hidden.
func SwitchRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}
