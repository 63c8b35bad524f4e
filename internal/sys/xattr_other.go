//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

func ListXattrs(string) ([]Xattr, error) { return nil, nil }

func SetXattr(string, string, []byte) error { return errdefs.ErrNotSupported }
