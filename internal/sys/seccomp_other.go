//go:build !linux

package sys

import (
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func InstallSeccompFilter([]byte) error {
	return fmt.Errorf("installing a seccomp filter: %w", errdefs.ErrNotSupported)
}
