package sys

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"golang.org/x/sys/unix"
)

// OpenNetns opens the network namespace file at path (e.g. a bind mount
// under /run/netns, or /proc/<pid>/ns/net) and checks that it is one.
func OpenNetns(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("statfs netns %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("%s is not a namespace file", path)
	}
	return f, nil
}

// ProcessNetns opens the process's network namespace: that of every
// thread no goroutine has locked to move it elsewhere. (/proc/self/ns/net
// would not do: it is the main thread's, and a goroutine locked to the
// main thread may be inside another namespace right now.)
func ProcessNetns() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	// A fresh goroutine runs on a thread no one has locked, so in the
	// process's namespace (InNetns and NewNetns lock the threads they move).
	go func() {
		f, err := OpenNetns("/proc/thread-self/ns/net")
		ch <- result{f, err}
	}()
	r := <-ch
	return r.f, r.err
}

// NewNetns creates a network namespace owned by the caller's user
// namespace and runs fn inside it, on a locked OS thread of its own, and
// returns the namespace as an open file (it lives as long as the file or
// a bind mount of it does). fn runs on the calling thread only: goroutines
// it starts run in the process's namespace. If fn fails, the namespace is
// closed and the error returned.
func NewNetns(fn func() error) (*os.File, error) {
	var ns *os.File
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			if errors.Is(err, unix.EPERM) {
				return fmt.Errorf("unshare(CLONE_NEWNET): %w: %w", err, errdefs.ErrNotSupported)
			}
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		f, err := OpenNetns("/proc/thread-self/ns/net")
		if err != nil {
			return err
		}
		if fn != nil {
			if err := fn(); err != nil {
				f.Close()
				return err
			}
		}
		ns = f
		return nil
	})
	return ns, err
}

// InNetns runs fn on a locked OS thread that has joined the network
// namespace ns, and returns fn's error. The thread goes back to its own
// namespace afterwards; if that fails, the thread is discarded rather
// than reused. Processes forked from fn (os/exec, syscall.ForkExec) start
// in ns; goroutines fn starts do not.
func InNetns(ns *os.File, fn func() error) error {
	return onThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns(%s): %w", ns.Name(), err)
		}
		return fn()
	})
}

// onThread runs fn on a fresh goroutine locked to its OS thread and
// restores the thread's network namespace afterwards. A thread whose
// namespace cannot be restored is left locked when its goroutine exits,
// which makes the Go runtime terminate it.
func onThread(fn func() error) error {
	type result struct{ err error }
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.OpenFile("/proc/thread-self/ns/net", os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{fmt.Errorf("opening the thread's netns: %w", err)}
			return
		}
		defer orig.Close()
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread exits with this goroutine.
			done <- result{errors.Join(ferr, fmt.Errorf("restoring the thread's netns: %w", err))}
			return
		}
		runtime.UnlockOSThread()
		done <- result{ferr}
	}()
	return (<-done).err
}

// BindNetns makes the namespace ns persistent at target (a new file,
// created here) with a bind mount, as `ip netns add` does.
func BindNetns(ns *os.File, target string) error {
	f, err := os.OpenFile(target, os.O_RDONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("creating netns mount point: %w", err)
	}
	f.Close()
	src := "/proc/self/fd/" + strconv.Itoa(int(ns.Fd()))
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(target)
		return fmt.Errorf("bind-mounting netns on %s: %w", target, err)
	}
	return nil
}

// UnbindNetns lazily unmounts a namespace bind mount made by BindNetns and
// removes its file. The namespace itself goes away (asynchronously, in
// the kernel) once no process, file or other mount holds it. A missing
// target is not an error.
func UnbindNetns(target string) error {
	err := unix.Unmount(target, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// IsNetnsMount reports whether path is a mounted namespace file (a bind
// mount made by BindNetns or `ip netns add`).
func IsNetnsMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// EnsureNetnsDir creates dir (normally /run/netns) and makes it a shared
// mount point, as iproute2 does, so that unmounting a namespace there
// also unmounts the copies that mount namespaces created since hold.
func EnsureNetnsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on itself: %w", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	return nil
}

// SetThreadNetns joins the calling OS thread (locked to its goroutine)
// to the network namespace ns.
func SetThreadNetns(ns *os.File) error {
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns(%s): %w", ns.Name(), err)
	}
	return nil
}
