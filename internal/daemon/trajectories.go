package daemon

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/trajectory"
)

// openTrajectories opens the trajectory store in JetStream (its stream,
// heads bucket and blob store are made on first use).
func (d *daemon) openTrajectories(ctx context.Context) (*trajectory.Store, error) {
	js, err := jetstream.New(d.nc)
	if err != nil {
		return nil, fmt.Errorf("opening JetStream: %w", err)
	}
	t := d.cfg.Trajectories
	return trajectory.Open(ctx, js, trajectory.Options{Retention: t.Retention.Duration, MaxBytes: t.MaxBytes, Logger: d.log})
}
