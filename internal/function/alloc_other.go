//go:build !linux

package function

import "github.com/dsec-dev/dsec/internal/errdefs"

// reserve is Linux-only; elsewhere linear memories are Go slices.
func reserve(uint64) ([]byte, error) { return nil, errdefs.ErrNotSupported }

func unreserve([]byte) {}

func release([]byte) error { return errdefs.ErrNotSupported }
