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
//     was interrupted → destroyed on the node if present, failed; but a
//     create another live server is making is left to it, and one whose
//     server has gone (its lease lapsed) is completed if the node has
//     the sandbox (leases.go);
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
			if m.createInFlight(rec.ID) {
				continue
			}
			if rec.Creator != "" {
				if !m.leases.creatorGone(rec.Creator, rec.CreatorRun, rec.StateSince) {
					continue
				}
				if m.finishOrphan(ctx, rec, present[rec.ID]) {
					present[rec.ID] = false
					interrupted++
				}
				continue
			}
			if rec.StateSince.After(m.started) && time.Since(rec.StateSince) < createDeadline {
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
		if !ok {
			// Another server's create whose record this process has not
			// heard of yet is not an orphan: ask the store.
			if rec, _, err := m.st.GetSandbox(ctx, s.ID); err == nil && rec.Node == node && sandbox.Live(rec.State) {
				continue
			}
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

// finishOrphan completes or fails the create of rec, whose server has
// gone: completed (running) if the node has the sandbox and nothing else
// was to be done after the node's create (a trajectory's start was), else
// destroyed on the node (it may still be making it) and failed. It
// reports whether the node's sandbox went.
func (m *Manager) finishOrphan(ctx context.Context, rec store.SandboxRecord, present bool) (destroyed bool) {
	m.log.Warn("finishing the create of a server that stopped", "sandbox", rec.ID, "creator", rec.Creator,
		"run", rec.CreatorRun, "node", rec.Node, "on_node", present)
	if present && rec.Trajectory == "" {
		_, err := m.transition(ctx, rec.ID, api.StatePending, api.StateRunning,
			"created: server "+rec.Creator+" stopped before it finished, "+m.leases.name+" did")
		if err == nil {
			return false
		}
		m.log.Warn("completing an orphaned create", "sandbox", rec.ID, "err", err)
	}
	m.destroyOnNode(ctx, rec.Node, rec.ID)
	m.fail(ctx, rec.ID, "interrupted: server "+rec.Creator+" stopped during create")
	return true
}

// finishOrphanedCreates reconciles the nodes that hold pending creates of
// servers that have gone, at most every few seconds per node.
func (m *Manager) finishOrphanedCreates(ctx context.Context, now time.Time) {
	nodes := map[string]bool{}
	m.cache.each(func(rec *store.SandboxRecord) {
		if rec.State == api.StatePending && rec.Creator != "" && rec.Node != "" && !nodes[rec.Node] &&
			!m.createInFlight(rec.ID) && m.leases.creatorGone(rec.Creator, rec.CreatorRun, rec.StateSince) {
			nodes[rec.Node] = true
		}
	})
	for n := range nodes {
		if m.dueOrphanCheck(n, now) {
			m.reconcile(ctx, n)
		}
	}
}

// dueOrphanCheck rate-limits finishOrphanedCreates per node.
func (m *Manager) dueOrphanCheck(n string, now time.Time) bool {
	m.inflightMu.Lock()
	defer m.inflightMu.Unlock()
	if now.Sub(m.orphanChecked[n]) < 5*time.Second {
		return false
	}
	m.orphanChecked[n] = now
	return true
}
