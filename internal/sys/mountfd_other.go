//go:build !linux

package sys

import (
	"fmt"
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func CloneMount(path string) (*os.File, error) {
	return nil, fmt.Errorf("cloning the mount at %s: %w", path, errdefs.ErrNotSupported)
}

func MoveMount(int, string) error { return errdefs.ErrNotSupported }

func IDMappedClone(source, target string, usernsFd int) error {
	return fmt.Errorf("id-mapped mounts: %w", errdefs.ErrNotSupported)
}

func ReplaceWritable([]string, []string, int, int) error { return errdefs.ErrNotSupported }

func SetMountReadOnly(string, bool) error { return errdefs.ErrNotSupported }

func BindWritable(string, int, int) error { return errdefs.ErrNotSupported }
