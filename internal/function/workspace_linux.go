package function

import (
	"fmt"

	"github.com/dsec-dev/dsec/internal/sys"
)

// mountWorkspace mounts a tmpfs of diskMB MiB on dir, so that the cap is
// enforced by the kernel. It returns errdefs.ErrNotSupported (wrapped) when
// the process may not mount (not root, or no CAP_SYS_ADMIN).
func mountWorkspace(dir string, diskMB int) error {
	return sys.MountTmpfs("tmpfs", dir, fmt.Sprintf("size=%dm,mode=0755", diskMB))
}

// unmountWorkspace unmounts dir, lazily if it is busy. A dir that is not a
// mount point is not an error.
func unmountWorkspace(dir string) error { return sys.Unmount(dir) }

// isTmpfsMount reports whether dir is the root of a tmpfs mount.
func isTmpfsMount(dir string) bool { return sys.IsTmpfsRoot(dir) }

// diskUsage returns the bytes used in a workspace.
func diskUsage(dir string, tmpfs bool) (int64, error) {
	if !tmpfs {
		return walkUsage(dir)
	}
	return sys.UsedBytes(dir)
}
