//go:build !linux

package sys

import (
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func OpenPTY() (master, tty *os.File, err error) { return nil, nil, errdefs.ErrNotSupported }

func SetWinsize(*os.File, uint16, uint16) error { return errdefs.ErrNotSupported }
