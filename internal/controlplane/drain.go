package controlplane

import (
	"context"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
)

// DefaultDrainDeadline is how long a drained node's sandboxes that cannot
// be resumed elsewhere may run on, when the drain does not say.
const DefaultDrainDeadline = time.Hour

// Cordon stops (on) or restarts (!on) placing sandboxes on node id;
// uncordoning ends a drain too. What is set outlives the node's
// heartbeats and this process (store.NodeAdmin).
func (m *Manager) Cordon(ctx context.Context, id string, on bool) (api.Node, error) {
	if _, err := m.knownNode(id); err != nil {
		return api.Node{}, err
	}
	if err := m.st.SetNodeAdmin(ctx, id, store.NodeAdmin{Cordoned: on}); err != nil {
		return api.Node{}, err
	}
	m.refreshNodes(ctx)
	return m.knownNode(id)
}

// Drain cordons node id and moves its sandboxes off: each recorded with
// resume_on_preempt is resumed on another node from its trajectory,
// behind its ID (its old incarnation is then destroyed); the others run
// on until they end, or until the deadline, when they are destroyed
// ("node_drained"). The node loop does the moving (drainNodes).
func (m *Manager) Drain(ctx context.Context, id string, req api.DrainRequest) (api.Node, error) {
	if req.DeadlineS < 0 || req.DeadlineS > m.lim.MaxTimeoutS {
		return api.Node{}, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "deadline_s must be between 0 and %d", m.lim.MaxTimeoutS)
	}
	if _, err := m.knownNode(id); err != nil {
		return api.Node{}, err
	}
	d := DefaultDrainDeadline
	if req.DeadlineS > 0 {
		d = time.Duration(req.DeadlineS) * time.Second
	}
	deadline := time.Now().Add(d).UTC()
	if err := m.st.SetNodeAdmin(ctx, id, store.NodeAdmin{Cordoned: true, Draining: true, DrainDeadline: &deadline}); err != nil {
		return api.Node{}, err
	}
	m.refreshNodes(ctx)
	m.drainNodes(ctx)
	return m.knownNode(id)
}

// knownNode returns node id as last listed.
func (m *Manager) knownNode(id string) (api.Node, error) {
	for _, n := range m.view.list() {
		if n.ID == id {
			return n, nil
		}
	}
	return api.Node{}, errdefs.New(errdefs.NotFound, api.CodeNodeNotFound, "node %q not found", id)
}

// drainNodes moves the sandboxes of draining nodes off (see Drain). It
// runs with each turn of the node loop.
func (m *Manager) drainNodes(ctx context.Context) {
	now := time.Now()
	for _, n := range m.view.list() {
		if !n.Draining {
			continue
		}
		past := n.DrainDeadline != nil && now.After(*n.DrainDeadline)
		var live []store.SandboxRecord
		m.cache.each(func(rec *store.SandboxRecord) {
			if rec.Node == n.ID && sandbox.Live(rec.State) && rec.State != api.StateStopping {
				live = append(live, *rec)
			}
		})
		for _, rec := range live {
			switch {
			case resumeAfterLoss(&rec):
				node, id := n.ID, rec.ID
				m.preempted(ctx, rec, "node "+node+" drained", func(ok bool) {
					if ok {
						m.destroyOnNode(ctx, node, id) // the old incarnation
					}
				})
			case past:
				if err := m.destroy(ctx, rec.ID, "node_drained"); err != nil {
					m.log.Warn("destroying a drained node's sandbox", "sandbox", rec.ID, "node", n.ID, "err", err)
				}
			}
		}
	}
}
