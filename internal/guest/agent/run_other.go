//go:build !linux

package agent

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Run is Linux-only.
func Run(ctx context.Context, opt Options) error {
	return fmt.Errorf("agent: %w", errdefs.ErrNotSupported)
}
