//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

func Reserve(uint64) ([]byte, error) { return nil, errdefs.ErrNotSupported }

func Unreserve([]byte) {}

func DropPages([]byte) error { return errdefs.ErrNotSupported }

func ResidentBytes(string) (int64, error) { return 0, errdefs.ErrNotSupported }
