package sys

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

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

// RenameNoReplace renames from to to, failing (EEXIST) if to exists,
// even as an empty directory (which rename(2) would replace).
func RenameNoReplace(from, to string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}
