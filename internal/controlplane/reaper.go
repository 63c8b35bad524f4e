package controlplane

import (
	"context"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/store"
)

// retryStopping is how long a sandbox may sit in stopping before the
// reaper retries its destroy.
const retryStopping = 15 * time.Second

// reapLoop enforces time to live, retries stuck destroys and purges old
// records, every Tick.
func (m *Manager) reapLoop(ctx context.Context) { m.every(ctx, m.opt.Tick, m.reap) }

// every calls fn at each tick of period until ctx ends, then marks the
// loop done (m.wg).
func (m *Manager) every(ctx context.Context, period time.Duration, fn func(context.Context, time.Time)) {
	defer m.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			fn(ctx, now)
		}
	}
}

func (m *Manager) reap(ctx context.Context, now time.Time) {
	if !m.leases.leading() {
		return
	}
	m.finishOrphanedCreates(ctx, now)
	var expired, stuck, purge []store.SandboxRecord
	m.cache.each(func(rec *store.SandboxRecord) {
		switch rec.State {
		case api.StatePending, api.StateRunning:
			// A pending sandbox past its TTL is reaped too: its create
			// has had its chance.
			if now.After(rec.ExpiresAt) {
				expired = append(expired, *rec)
			}
		case api.StateStopping:
			if now.Sub(rec.StateSince) > retryStopping {
				stuck = append(stuck, *rec)
			}
		case api.StateStopped, api.StateFailed:
			if rec.EndedAt != nil && now.Sub(*rec.EndedAt) > m.lim.Retention {
				purge = append(purge, *rec)
			}
		}
	})
	for _, rec := range expired {
		m.background(ctx, "expiring sandbox", rec.ID, func(ctx context.Context) error { return m.destroy(ctx, rec.ID, "expired") })
	}
	for _, rec := range stuck {
		m.background(ctx, "retrying destroy", rec.ID, func(ctx context.Context) error { return m.retryDestroy(ctx, rec) })
	}
	for _, rec := range purge {
		if err := m.st.PurgeSandbox(ctx, rec.ID); err != nil && ctx.Err() == nil {
			m.log.Warn("purging record", "sandbox", rec.ID, "err", err)
		}
	}
}

// background runs fn on a bounded pool of goroutines, skipping the work
// if the pool is full (the next sweep tries again).
func (m *Manager) background(ctx context.Context, what, id string, fn func(context.Context) error) {
	select {
	case m.sem <- struct{}{}:
	default:
		return
	}
	m.inflightMu.Lock()
	if _, busy := m.inflight[id]; busy {
		m.inflightMu.Unlock()
		<-m.sem
		return
	}
	m.inflight[id] = struct{}{}
	m.inflightMu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.inflightMu.Lock()
			delete(m.inflight, id)
			m.inflightMu.Unlock()
			<-m.sem
		}()
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn(what, "sandbox", id, "err", err)
		}
	}()
}

// retryDestroy finishes a destroy that a previous attempt (or a previous
// process) left in stopping.
func (m *Manager) retryDestroy(ctx context.Context, rec store.SandboxRecord) error {
	// rec may be a stale copy: the reaper and a reconciliation can both
	// pick the same stopping record, one after the other (background runs
	// one at a time per sandbox, not once). Finished meanwhile: nothing
	// to do, and no second destroy on the node.
	if cur, _, ok := m.cache.get(rec.ID); ok && cur.State != api.StateStopping {
		return nil
	}
	if err := m.nodes.Destroy(ctx, rec.Node, rec.ID); err != nil {
		return err
	}
	_, err := m.mutate(ctx, rec.ID, func(r *store.SandboxRecord) (bool, error) {
		if r.State != api.StateStopping {
			return false, nil
		}
		setState(r, api.StateStopped, "")
		return true, nil
	})
	return err
}
