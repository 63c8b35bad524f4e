package function

import (
	"errors"
	"fmt"
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
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
	err := sys.MountTmpfs("dsec-function", dir, "mode=0700,size=256m")
	if errors.Is(err, errdefs.ErrNotSupported) {
		return false, nil // not root: state stays on the host file system
	}
	if err != nil {
		return false, fmt.Errorf("the sandbox state tmpfs: %w", err)
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
