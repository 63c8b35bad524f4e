//go:build !linux

package vmtier

import (
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func plugTap(string) (*os.File, int, error) { return nil, 0, errdefs.ErrNotSupported }

func unplugTap(string) error { return errdefs.ErrNotSupported }
