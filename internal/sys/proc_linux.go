package sys

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// SetNofile sets process pid's RLIMIT_NOFILE, soft and hard, to n. The
// node sets it on a sandbox's first process: raising a hard limit needs
// CAP_SYS_RESOURCE in the initial user namespace, which the sandbox never
// has.
func SetNofile(pid int, n uint64) error {
	lim := unix.Rlimit{Cur: n, Max: n}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		return fmt.Errorf("setting the open files limit of %d: %w", pid, err)
	}
	return nil
}

// SetChildSubreaper makes this process the reaper of its orphaned
// descendants, as PID 1 is (PR_SET_CHILD_SUBREAPER).
func SetChildSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("becoming a child subreaper: %w", err)
	}
	return nil
}

// SignalName is the signal's name ("SIGKILL"), or "" if it has none.
func SignalName(s syscall.Signal) string { return unix.SignalName(s) }

// Gettid is the calling thread's id (the process's pid on its main
// thread).
func Gettid() int { return unix.Gettid() }
