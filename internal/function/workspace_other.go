//go:build !linux

package function

import (
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// mountWorkspace: workspaces are plain directories off Linux, and their
// size cap is not enforced.
func mountWorkspace(dir string, _ int) error {
	return fmt.Errorf("mounting tmpfs on %s: %w", dir, errdefs.ErrNotSupported)
}

func unmountWorkspace(string) error { return nil }

func isTmpfsMount(string) bool { return false }

func diskUsage(dir string, _ bool) (int64, error) { return walkUsage(dir) }
