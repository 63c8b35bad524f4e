//go:build !linux

package sys

import (
	"fmt"
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func MountTmpfs(source, target, options string) error {
	return fmt.Errorf("mounting tmpfs on %s: %w", target, errdefs.ErrNotSupported)
}

func Unmount(string) error { return nil }

func DetachMount(string) error { return nil }

func MountErofs(meta, blob, target string) error {
	return fmt.Errorf("mounting erofs on %s: %w", target, errdefs.ErrNotSupported)
}

func MountErofsReadahead(meta, blob, target string, kb int) (bool, error) {
	return false, fmt.Errorf("mounting erofs on %s: %w", target, errdefs.ErrNotSupported)
}

func MountOverlay(target string, lowers []string, upper, work string) error {
	return fmt.Errorf("mounting overlay on %s: %w", target, errdefs.ErrNotSupported)
}

func MountOverlayByFD(target string, lowers []string, upper, work string) error {
	return MountOverlay(target, lowers, upper, work)
}

func MountFUSE(dir, subtype string) (*os.File, error) {
	return nil, fmt.Errorf("mounting fuse at %s: %w", dir, errdefs.ErrNotSupported)
}

func MountFUSEConn(dir, name, options string) (int, error) {
	return -1, fmt.Errorf("mounting fuse at %s: %w", dir, errdefs.ErrNotSupported)
}

func UnmountFUSE(string) (bool, error) { return false, nil }

func EnsureTmpfs(source, dir, options string) (bool, error) { return false, nil }

func UnmountTmpfsIfEmpty(dir string) error { return nil }

func PollFUSEOnce(dir, name string) error {
	return fmt.Errorf("polling a FUSE file: %w", errdefs.ErrNotSupported)
}
