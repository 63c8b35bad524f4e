//go:build !linux

package layer

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// buildState needs Linux: sandbox state (whiteouts, times) is read with
// its stat calls, and only Linux nodes snapshot.
func buildState(ctx context.Context, root, outDir string) (Artifact, error) {
	return Artifact{}, fmt.Errorf("building a state layer: %w", errdefs.ErrNotSupported)
}
