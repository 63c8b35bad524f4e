//go:build !linux

package vmm

import "github.com/dsec-dev/dsec/internal/errdefs"

// Usage is what the host measures of a VM's QEMU process.
type Usage struct {
	RSSBytes, PeakRSSBytes int64
	CPUSeconds             float64
}

// Usage is Linux-only.
func (vm *VM) Usage() (Usage, error) { return Usage{}, errdefs.ErrNotSupported }
