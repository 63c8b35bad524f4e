package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/hollow"
	"github.com/dsec-dev/dsec/internal/node"
)

// startHollow runs cfg.Node.Hollow hollow nodes, <id>-h0001 and on, in
// this process, on its one NATS connection: each a node service with the
// hollow tiers (internal/hollow), heartbeating and serving the node
// protocol like a real one. They hold no layer cache and no state on
// disk: their sandboxes end with the process, and at a clean stop they
// are destroyed and the nodes leave.
func (d *daemon) startHollow(ctx context.Context, cu *cleanup.Stack) error {
	reg := hollow.Registry()
	agents := make([]*node.Service, 0, d.cfg.Node.Hollow)
	cu.Add(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, a := range agents {
			a.DestroyAll(sctx)
			a.Stop(sctx, d.st)
		}
	})
	for i := range d.cfg.Node.Hollow {
		a, err := node.New(node.Options{
			ID: fmt.Sprintf("%s-h%04d", d.cfg.Node.ID, i+1), Registry: reg, Logger: d.log, Version: d.build.Version,
			MaxSandboxes: d.cfg.Node.MaxSandboxes,
			Starts: node.StartLimits{Slots: d.cfg.Node.MaxStarts, Queue: d.cfg.Node.StartQueue,
				Wait: time.Duration(d.cfg.Node.StartWaitS) * time.Second},
		})
		if err != nil {
			return err
		}
		if err := a.Start(ctx, d.nc, d.st); err != nil {
			return fmt.Errorf("starting hollow node %s: %w", a.ID(), err)
		}
		agents = append(agents, a)
	}
	d.info.NodeID = agents[0].ID()
	d.log.Info("hollow nodes started", "count", len(agents), "first", agents[0].ID())
	return nil
}
