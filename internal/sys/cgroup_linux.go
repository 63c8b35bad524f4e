package sys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// CgroupID returns the id of the cgroup2 directory at path: the value
// bpf_get_current_cgroup_id() returns for a task in it. It is read from
// the directory's kernfs file handle, which carries the 64-bit id (as
// libbpf and cilium/ebpf do), not from stat, so callers can check one
// against the other.
func CgroupID(path string) (uint64, error) {
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, path, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the cgroup id of %s: %w", path, err)
	}
	b := h.Bytes()
	if len(b) < 8 {
		return 0, fmt.Errorf("reading the cgroup id of %s: %d-byte file handle", path, len(b))
	}
	return binary.NativeEndian.Uint64(b[:8]), nil
}

// IsBusy reports whether err is EBUSY (a cgroup that still has tasks or
// children cannot be removed).
func IsBusy(err error) bool { return errors.Is(err, unix.EBUSY) }

// WaitModified waits up to timeout for a kernfs file open as f (a
// cgroup's cgroup.events) to change after it was last read: kernfs wakes
// pollers with POLLPRI on every notification. A timeout is not an error;
// callers re-read either way.
func WaitModified(f *os.File, timeout time.Duration) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = sc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
		for {
			ts := unix.NsecToTimespec(timeout.Nanoseconds())
			_, perr = unix.Ppoll(fds, &ts, nil)
			if !errors.Is(perr, unix.EINTR) {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return perr
}
