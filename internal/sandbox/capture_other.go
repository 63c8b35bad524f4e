//go:build !linux

package sandbox

import (
	"context"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func captureState(context.Context, CaptureOptions) (*StateIndex, CaptureStats, error) {
	return nil, CaptureStats{}, errdefs.ErrNotSupported
}
