package controlplane

import (
	"context"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
)

// reconcile compares the records of a node's sandboxes with what the node
// reports running, after either side restarted:
//   - running here, absent there: the sandbox is lost → failed;
//   - pending here, with no create in flight in this process: the create
//     was interrupted → destroyed on the node if present, failed;
//   - stopping here: the destroy is finished;
//   - present there with no live record for that node: an orphan →
//     destroyed.
func (m *Manager) reconcile(ctx context.Context, node string) {
	listed := time.Now()
	have, err := m.nodes.List(ctx, node)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("reconcile: listing node", "node", node, "err", err)
		}
		return
	}
	present := make(map[string]bool, len(have))
	for _, s := range have {
		present[s.ID] = true
	}
	var recs []store.SandboxRecord
	m.cache.each(func(rec *store.SandboxRecord) {
		if rec.Node == node && sandbox.Live(rec.State) {
			recs = append(recs, *rec)
		}
	})
	var lost, interrupted, stopping int
	for _, rec := range recs {
		switch rec.State {
		case api.StateRunning:
			// A sandbox that became running after the list started may
			// simply not be in it.
			if !present[rec.ID] && rec.StateSince.Before(listed) {
				if resumeAfterLoss(&rec) {
					m.preempted(ctx, rec, "lost: its node no longer runs it", nil)
				} else {
					m.fail(ctx, rec.ID, "lost: its node no longer runs it")
				}
				lost++
			}
		case api.StatePending:
			if m.createInFlight(rec.ID) || rec.StateSince.After(m.started) && time.Since(rec.StateSince) < createDeadline {
				continue
			}
			if present[rec.ID] {
				m.destroyOnNode(ctx, node, rec.ID)
				present[rec.ID] = false // destroyed: not an orphan below
			}
			m.fail(ctx, rec.ID, "interrupted: the control plane restarted during create")
			interrupted++
		case api.StateStopping:
			rec := rec
			m.background(ctx, "finishing destroy", rec.ID, func(ctx context.Context) error { return m.retryDestroy(ctx, rec) })
			// Being destroyed: not an orphan below, even if the destroy
			// has finished (and its record stopped) by then.
			present[rec.ID] = false
			stopping++
		}
	}
	var orphans int
	for _, s := range have {
		if !present[s.ID] {
			continue // destroyed above
		}
		rec, _, ok := m.cache.get(s.ID)
		if ok && rec.Node == node && sandbox.Live(rec.State) {
			continue
		}
		m.destroyOnNode(ctx, node, s.ID)
		orphans++
	}
	if lost+interrupted+stopping+orphans > 0 {
		m.log.Info("reconciled node", "node", node, "lost", lost, "interrupted", interrupted,
			"stopping", stopping, "orphans", orphans, "running", len(have)-orphans)
	}
}

// failNode fails the sandboxes of a node that stopped heartbeating.
func (m *Manager) failNode(ctx context.Context, node string) {
	var ids []string
	m.cache.each(func(rec *store.SandboxRecord) {
		if rec.Node == node && sandbox.Live(rec.State) {
			ids = append(ids, rec.ID)
		}
	})
	for _, id := range ids {
		if rec, _, ok := m.cache.get(id); ok && resumeAfterLoss(&rec) {
			m.preempted(ctx, rec, "node lost", nil)
			continue
		}
		_, err := m.mutate(ctx, id, func(rec *store.SandboxRecord) (bool, error) {
			switch rec.State {
			case api.StateStopping:
				setState(rec, api.StateStopped, "node lost")
			case api.StatePending, api.StateRunning:
				setState(rec, api.StateFailed, "node lost")
			default:
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			m.log.Warn("failing sandbox of lost node", "sandbox", id, "node", node, "err", err)
		}
	}
	if len(ids) > 0 {
		m.log.Warn("node lost", "node", node, "sandboxes", len(ids))
	}
}
