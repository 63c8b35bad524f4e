package function

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mountStateFS puts the sandboxes directory on a tmpfs, when we may mount.
// A sandbox's directory, state file and workspace mount point are made and
// removed on every create and destroy; on the host's ext4 that cost
// ~225 µs per sandbox with 8 in parallel, on tmpfs ~60 µs. The state
// lives as long as the workspaces (tmpfs too): it survives restarts of
// the node agent, not of the host. It reports whether a tmpfs is in place.
func mountStateFS(dir string) (bool, error) {
	if isTmpfsMount(dir) {
		return true, nil
	}
	if os.Geteuid() != 0 {
		return false, nil
	}
	err := unix.Mount("dsec-function", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=256m")
	if err != nil {
		return false, fmt.Errorf("mounting the sandbox state tmpfs on %s: %w", dir, err)
	}
	return true, nil
}

// unmountStateFS removes the state tmpfs if no sandbox is left in it.
func unmountStateFS(dir string) error {
	if !isTmpfsMount(dir) {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) > 0 {
		return err
	}
	return unmountWorkspace(dir)
}
