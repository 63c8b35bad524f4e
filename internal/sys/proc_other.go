//go:build !linux

package sys

import (
	"fmt"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func SetNofile(pid int, n uint64) error {
	return fmt.Errorf("rlimits: %w", errdefs.ErrNotSupported)
}

func SignalName(s syscall.Signal) string { return "" }

func SetChildSubreaper() error { return errdefs.ErrNotSupported }

// Gettid: no thread ids off Linux.
func Gettid() int { return -1 }
