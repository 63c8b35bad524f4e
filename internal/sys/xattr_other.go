//go:build !linux

package sys

import (
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func ListXattrs(string) ([]Xattr, error) { return nil, nil }

func SetXattr(string, string, []byte) error { return errdefs.ErrNotSupported }

func FileXattr(*os.File, string) ([]byte, error) { return nil, errdefs.ErrNotSupported }
