package sys

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// SetHostnameIn sets the hostname of the UTS namespace uts (an open
// /proc/<pid>/ns/uts) from a thread that joins it for the call. A thread
// that cannot return to its own namespace exits with its goroutine.
func SetHostnameIn(uts *os.File, name string) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/uts")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(uts.Fd()), unix.CLONE_NEWUTS); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("joining a uts namespace: %w", err)
			return
		}
		serr := unix.Sethostname([]byte(name))
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWUTS); err != nil {
			done <- errors.Join(serr, fmt.Errorf("restoring the thread's uts namespace: %w", err))
			return // locked: the thread goes
		}
		runtime.UnlockOSThread()
		done <- serr
	}()
	return <-done
}

// RenameNoReplace renames from to to, failing (EEXIST) if to exists,
// even as an empty directory (which rename(2) would replace).
func RenameNoReplace(from, to string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}
