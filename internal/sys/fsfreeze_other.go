//go:build !linux

package sys

import (
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func SyncFS(*os.File) error { return errdefs.ErrNotSupported }

func FreezeFS(*os.File) error { return errdefs.ErrNotSupported }

func ThawFS(*os.File) error { return errdefs.ErrNotSupported }
