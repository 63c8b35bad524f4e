//go:build !linux

package sys

import (
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func CgroupID(string) (uint64, error) { return 0, errdefs.ErrNotSupported }

func IsBusy(error) bool { return false }

func WaitModified(*os.File, time.Duration) error { return errdefs.ErrNotSupported }
