//go:build !linux

package guest

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Init is Linux-only.
func Init(ctx context.Context, argv []string) (int, error) {
	return ExitCannot, fmt.Errorf("dsec-guest init: %w", errdefs.ErrNotSupported)
}
