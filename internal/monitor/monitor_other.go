//go:build !(linux && amd64)

package monitor

import (
	"log/slog"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Monitor needs Linux on x86_64 (its programs and syscall table are
// built for it).
type Monitor struct{}

func Start(*slog.Logger) (*Monitor, error) { return nil, errdefs.ErrNotSupported }
func (*Monitor) Watch(uint64) error        { return errdefs.ErrNotSupported }
func (*Monitor) Unwatch(uint64) error      { return nil }
func (*Monitor) Events() <-chan Event      { return nil }
func (*Monitor) Dropped() uint64           { return 0 }
func (*Monitor) Close() error              { return nil }

func (*Monitor) RestrictExec(uint64, uint64, []string) error { return errdefs.ErrNotSupported }
func (*Monitor) UnrestrictExec(uint64) error                 { return nil }
