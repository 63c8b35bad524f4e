//go:build !linux

package vminit

import (
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Run is the guest's init; microVM guests run Linux only.
func Run(version string) error {
	return fmt.Errorf("vminit: %w", errdefs.ErrNotSupported)
}

// AgentMain is the agent beside a VM guest's init system; Linux only.
func AgentMain(args []string) error {
	return fmt.Errorf("vminit: %w", errdefs.ErrNotSupported)
}
