//go:build !linux

package network

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Manager manages sandbox networks; it exists only on Linux.
type Manager struct{}

// Stats are counts for metrics and tests.
type Stats struct{ Live, Pooled int }

var errUnsupported = fmt.Errorf("sandbox networks: %w", errdefs.ErrNotSupported)

func New(context.Context, Options) (*Manager, error) { return nil, errUnsupported }

func (m *Manager) Acquire(context.Context, string, Policy) (*Endpoint, error) {
	return nil, errUnsupported
}

func (m *Manager) Release(context.Context, string) error           { return errUnsupported }
func (m *Manager) SetPolicy(context.Context, string, Policy) error { return errUnsupported }
func (m *Manager) Recover(context.Context, []string) error         { return errUnsupported }
func (m *Manager) Endpoint(string) (*Endpoint, bool)               { return nil, false }
func (m *Manager) Stats() Stats                                    { return Stats{} }
func (m *Manager) Resolvers() []netip.Addr                         { return nil }
func (m *Manager) Close(context.Context) error                     { return nil }
func EnterNetns(string, func() error) error                        { return errUnsupported }
