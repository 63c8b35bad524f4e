//go:build !linux

package sys

import (
	"fmt"
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func OpenNetns(path string) (*os.File, error) {
	return nil, fmt.Errorf("opening netns %s: %w", path, errdefs.ErrNotSupported)
}

func ProcessNetns() (*os.File, error) { return nil, errdefs.ErrNotSupported }

func NewNetns(func() error) (*os.File, error) { return nil, errdefs.ErrNotSupported }

func InNetns(*os.File, func() error) error { return errdefs.ErrNotSupported }

func BindNetns(*os.File, string) error { return errdefs.ErrNotSupported }

func UnbindNetns(string) error { return nil }

func IsNetnsMount(string) bool { return false }

func EnsureNetnsDir(string) error { return errdefs.ErrNotSupported }

func SetThreadNetns(*os.File) error { return errdefs.ErrNotSupported }
