package sys

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// WithThreadEUID runs fn with the calling thread's effective uid set to
// euid and its capabilities still effective, then sets the thread's
// effective uid back. The caller must be locked to its OS thread: the
// change is made with a raw setresuid, which affects only the calling
// thread (Go's own Setresuid changes every thread of the process).
//
// Its use: a user namespace is owned by the effective uid of the process
// that creates it, and the kernel charges per-user counts (inotify
// instances and watches, POSIX message queue bytes, pending signals,
// user namespaces…) at every level of the namespace chain to the owner
// of the namespace below. A sandbox cloned by host root is owned by host
// root, so every sandbox and host root itself share one budget; cloned
// from a thread whose effective uid is the sandbox's own owner uid, each
// sandbox has a budget of its own.
//
// The real and saved uids stay 0, so the thread keeps its permitted
// capabilities (the kernel clears only the effective set when the
// effective uid leaves 0); fn runs with them raised again, which it
// needs to write the new namespace's uid and gid maps (CAP_SETUID and
// CAP_SETGID in the parent namespace). The real uid staying 0 also keeps
// RLIMIT_NPROC unenforced for the new namespace, as it was.
//
// stuck reports that the thread could not get its effective uid back: it
// must run nothing else (the caller lets it exit). A change of effective
// uid makes the kernel clear the process's dumpable flag; it is set back
// to what it was when the process first called WithThreadEUID.
func WithThreadEUID(euid int, fn func() error) (stuck bool, err error) {
	old := unix.Geteuid()
	if euid == old {
		return false, fn()
	}
	dumpable := processDumpable()
	if err := setThreadEUID(euid); err != nil {
		return false, fmt.Errorf("setting the thread's effective uid to %d: %w", euid, err)
	}
	err = raiseEffective()
	if err == nil {
		err = fn()
	}
	if rerr := setThreadEUID(old); rerr != nil || unix.Geteuid() != old {
		return true, errors.Join(err, fmt.Errorf("setting the thread's effective uid back to %d: %w", old, rerr))
	}
	// Back to uid 0, the kernel made the effective set the permitted one.
	_, _, _ = unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, dumpable, 0)
	return false, err
}

// processDumpable is the process's dumpable flag before any
// WithThreadEUID changed it.
var processDumpable = sync.OnceValue(func() uintptr {
	v, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE, 0, 0)
	if e != 0 {
		return 1
	}
	return v
})

// setThreadEUID sets the calling thread's effective uid only.
func setThreadEUID(euid int) error {
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(euid), keep); e != 0 {
		return e
	}
	return nil
}

// raiseEffective makes the calling thread's effective capabilities its
// permitted ones (capset is per thread).
func raiseEffective() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the thread's capabilities: %w", err)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("raising the thread's capabilities: %w", err)
	}
	return nil
}

// SetNotDumpable clears this process's dumpable flag (PR_SET_DUMPABLE 0):
// no core dumps, and processes without CAP_SYS_PTRACE over its user
// namespace can neither ptrace it nor read its /proc/PID/mem. Programs it
// starts get the flag back at execve.
func SetNotDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the dumpable flag: %w", err)
	}
	return nil
}

// Securebits (linux/securebits.h).
const (
	secbitNoroot       = 1 << 0
	secbitNorootLocked = 1 << 1
)

// SetThreadNoRoot sets SECBIT_NOROOT, locked, on the calling thread
// (threads and processes it starts inherit it): executing a program as
// root then grants no capability of itself.
func SetThreadNoRoot() error {
	if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, secbitNoroot|secbitNorootLocked, 0); e != 0 {
		return e
	}
	return nil
}

// SetProcessNoRoot is SetThreadNoRoot on every thread of the process
// (securebits are per thread; one stop-the-world sets them all).
func SetProcessNoRoot() error {
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, secbitNoroot|secbitNorootLocked, 0); e != 0 {
		return e
	}
	return nil
}

// DropBoundingCap removes capability c from the calling thread's
// bounding set (PR_CAPBSET_DROP; the set is per thread).
func DropBoundingCap(c int) error {
	if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
		return e
	}
	return nil
}

// SetNoNewPrivs sets no_new_privs on the calling thread (threads and
// processes it starts inherit it): no exec can gain privileges.
func SetNoNewPrivs() error {
	if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return e
	}
	return nil
}
