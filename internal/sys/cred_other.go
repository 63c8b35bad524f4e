//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

func WithThreadEUID(int, func() error) (bool, error) { return false, errdefs.ErrNotSupported }

func SetNotDumpable() error { return errdefs.ErrNotSupported }
