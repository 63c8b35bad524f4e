package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The freeze ioctls (linux/fs.h: _IOWR('X', 119, int) and 120), which
// x/sys/unix does not name.
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// SyncFS writes the dirty data of the file system that holds f to its
// device (syncfs(2)).
func SyncFS(f *os.File) error {
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", f.Name(), err)
	}
	return nil
}

// FreezeFS freezes the file system that holds f (FIFREEZE): dirty data
// is written out and every later write to it, and every change of its
// metadata, waits until ThawFS. Reads go on. It fails with EBUSY when
// the file system is frozen already and with EOPNOTSUPP when it cannot
// be frozen (tmpfs). It needs CAP_SYS_ADMIN.
func FreezeFS(f *os.File) error {
	if err := unix.IoctlSetInt(int(f.Fd()), ioctlFIFREEZE, 0); err != nil {
		return fmt.Errorf("freezing the file system of %s: %w", f.Name(), err)
	}
	return nil
}

// ThawFS thaws the file system that holds f (FITHAW); it fails with
// EINVAL when the file system is not frozen.
func ThawFS(f *os.File) error {
	if err := unix.IoctlSetInt(int(f.Fd()), ioctlFITHAW, 0); err != nil {
		return fmt.Errorf("thawing the file system of %s: %w", f.Name(), err)
	}
	return nil
}
