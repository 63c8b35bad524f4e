package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

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
