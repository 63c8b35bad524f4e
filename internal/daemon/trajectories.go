package daemon

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/natsbus"
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
	var st *trajectory.Store
	err = natsbus.Retry(ctx, d.log, "opening the trajectory store", func(ctx context.Context) (err error) {
		st, err = trajectory.Open(ctx, js, trajectory.Options{Retention: t.Retention.Duration, MaxBytes: t.MaxBytes, Logger: d.log,
			Replicas: d.cfg.NATS.StreamReplicas()})
		return err
	})
	return st, err
}
