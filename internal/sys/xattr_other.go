//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

// Xattr is one extended attribute of a file.
type Xattr struct {
	Name  string
	Value []byte
}

func ListXattrs(string) ([]Xattr, error)         { return nil, nil }
func SetXattr(string, string, []byte) error      { return errdefs.ErrNotSupported }
func Mknod(string, uint32, uint32, uint32) error { return errdefs.ErrNotSupported }

// Mode bits for Mknod (Linux values).
const (
	ModeChar  = 0x2000
	ModeBlock = 0x6000
	ModeFifo  = 0x1000
)
