package sys

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
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

// EnterSmallMountNS moves the calling OS thread, which must be locked to
// its goroutine and stay locked for the rest of its life, into a mount
// namespace of its own whose root is a fresh tmpfs holding only binds of
// the given host paths. mountpoint is an existing host directory the
// tmpfs is built on (the host never sees it: every mount here is
// private). A process forked from the thread with CLONE_NEWNS copies this
// table of a few mounts instead of the host's, which grows with
// everything the node mounts.
func EnterSmallMountNS(mountpoint string, binds []Bind) error {
	// CLONE_FS: the thread stops sharing its root and working directory
	// with the process's other threads, which setns and pivot_root need.
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		if os.Geteuid() != 0 {
			return fmt.Errorf("unshare(CLONE_NEWNS): %w: %w", err, errdefs.ErrNotSupported)
		}
		return fmt.Errorf("unshare(CLONE_NEWNS): %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount("dsec-forker", mountpoint, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755"); err != nil {
		return fmt.Errorf("mounting the small root: %w", err)
	}
	for _, b := range binds {
		fi, err := os.Stat(b.Path)
		if err != nil {
			return err
		}
		target := filepath.Join(mountpoint, b.Path)
		if fi.IsDir() {
			err = os.MkdirAll(target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			err = os.WriteFile(target, nil, 0o644)
		}
		if err != nil {
			return err
		}
		flags := uintptr(unix.MS_BIND)
		if b.Recursive {
			flags |= unix.MS_REC
		}
		if err := unix.Mount(b.Path, target, "", flags, ""); err != nil {
			return fmt.Errorf("binding %s: %w", b.Path, err)
		}
	}
	return PivotRoot(mountpoint)
}

// SetHostnameIn sets the hostname of the UTS namespace uts (an open
// /proc/<pid>/ns/uts) from a thread that joins it for the call. A thread
// that cannot return to its own namespace exits with its goroutine.
func SetHostnameIn(uts *os.File, name string) error {
	var err error
	onSideThread(func() bool {
		orig, oerr := os.Open("/proc/thread-self/ns/uts")
		if oerr != nil {
			err = oerr
			return true
		}
		defer orig.Close()
		if serr := unix.Setns(int(uts.Fd()), unix.CLONE_NEWUTS); serr != nil {
			err = fmt.Errorf("joining a uts namespace: %w", serr)
			return true
		}
		err = unix.Sethostname([]byte(name))
		if rerr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWUTS); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restoring the thread's uts namespace: %w", rerr))
			return false // the thread goes
		}
		return true
	})
	return err
}

// holdEnv makes a re-executed copy of the running binary wait for its
// stdin to close and exit: the short-lived owner of a user namespace.
const holdEnv = "_DSEC_SYS_HOLD_USERNS"

func init() {
	// Runs in every binary that links this package (dsec, its tests). A Go
	// process cannot unshare a user namespace itself (it is
	// multi-threaded), so NewUserns starts a copy of the binary in one.
	if os.Getenv(holdEnv) == "1" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

// NewUserns returns an open user namespace mapping ids 0..count-1 to
// hostUID.. and hostGID.. on the host: what id-mapped mounts need. The
// caller closes it.
func NewUserns(hostUID, hostGID, count int) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return -1, fmt.Errorf("creating a user namespace: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer pr.Close()
	defer pw.Close()
	cmd := exec.Command(exe)
	cmd.Env = []string{holdEnv + "=1"}
	cmd.Stdin = pr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostUID, Size: count}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostGID, Size: count}},
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("creating a user namespace: %w", err)
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	pw.Close()
	werr := cmd.Wait()
	if err != nil {
		return -1, fmt.Errorf("opening the user namespace: %w", err)
	}
	if werr != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("user namespace holder: %w", werr)
	}
	return fd, nil
}

// UserNSOwner returns the host uid that owns the user namespace of
// process pid (NS_GET_OWNER_UID), as the caller's namespace sees it.
func UserNSOwner(pid int) (int, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	uid, err := unix.IoctlGetUint32(int(f.Fd()), unix.NS_GET_OWNER_UID)
	if err != nil {
		return 0, fmt.Errorf("reading the owner of %d's user namespace: %w", pid, err)
	}
	return int(uid), nil
}

// RunContained runs cmd (made by exec.Command or exec.CommandContext, not
// yet started) to its end in a mount namespace and a PID namespace of its
// own, for a tool that mounts things and forks helpers (debootstrap
// mounts /proc and /sys in the tree it fills and runs dpkg chrooted
// there):
//
//   - every mount in the namespace is private: the host's mount table
//     never shows what cmd mounts, so nothing walking the host's tree
//     (an `rm -rf` of the directory) can reach into it, and the mounts
//     go with the namespace's last process;
//   - cmd's program is the PID namespace's init: when it ends or is
//     killed, the kernel kills every process it left, wherever they
//     chrooted;
//   - all of it is killed when cmd's context ends (exec.CommandContext)
//     and when the calling process dies.
//
// The namespaces are made by util-linux's unshare(1), which cmd runs
// through (its Path and Args are rewritten): this process's threads never
// leave the host's namespaces. unshare forks the program and kills it
// with SIGKILL when it dies itself (--kill-child), and unshare gets
// SIGKILL when this process dies (Pdeathsig). It returns cmd.Wait's error.
func RunContained(cmd *exec.Cmd) error {
	if cmd.Err != nil {
		return cmd.Err
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("running %s contained needs unshare (Debian util-linux): %w", cmd.Path, err)
	}
	cmd.Args = append([]string{"unshare", "--mount", "--propagation=private", "--pid", "--kill-child=SIGKILL", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = unshare
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	// Pdeathsig fires when the thread that forked ends, not the process,
	// and Go ends a thread whose locked goroutine exits: keep this one
	// locked (it is not otherwise changed) until cmd has ended.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Wait()
}

// Unshare moves the calling thread into new namespaces (flags:
// syscall.CLONE_NEW*).
func Unshare(flags int) error { return unix.Unshare(flags) }

// Sethostname sets the hostname of the calling thread's UTS namespace.
func Sethostname(name string) error { return unix.Sethostname([]byte(name)) }
