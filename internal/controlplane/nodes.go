package controlplane

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/scheduler"
	"github.com/dsec-dev/dsec/internal/store"
)

// nodeView is the control plane's picture of the nodes, refreshed from
// their heartbeats, plus placements not yet reflected in them.
type nodeView struct {
	mu    sync.Mutex // guards following fields
	nodes []api.Node
	seen  map[string]time.Time // node → last time it was listed
	// placed counts sandboxes placed on a node and not yet visible in its
	// heartbeat (creates in flight, and done since the heartbeat was
	// taken), so that a burst of creates between heartbeats spreads.
	placed map[string]int
	beat   map[string]time.Time // node → LastSeen of the heartbeat placed counts from
	// started: node → its process's start, as last heard; a new one is
	// a restart, which may have lost sandboxes.
	started map[string]time.Time
}

func newNodeView() *nodeView {
	return &nodeView{seen: map[string]time.Time{}, placed: map[string]int{}, beat: map[string]time.Time{},
		started: map[string]time.Time{}}
}

func (v *nodeView) list() []api.Node {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.nodes)
}

// pick places a sandbox and counts it on the chosen node until the node's
// next heartbeat; done(false) uncounts a create that failed.
func (v *nodeView) pick(req scheduler.Request, stale time.Duration) (node string, done func(ok bool), err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	node, err = scheduler.Pick(v.nodes, req, time.Now(), stale, v.placed)
	if err != nil {
		return "", nil, err
	}
	v.placed[node]++
	beat := v.beat[node]
	return node, func(ok bool) {
		v.mu.Lock()
		defer v.mu.Unlock()
		// After a new heartbeat the count restarted and the heartbeat
		// shows this sandbox (or not) by itself.
		if !ok && v.beat[node] == beat && v.placed[node] > 0 {
			v.placed[node]--
		}
	}, nil
}

// refreshNodes reloads the node list. It returns the nodes that appeared
// since the last refresh (new, or back after missing heartbeats), which
// must be reconciled.
func (m *Manager) refreshNodes(ctx context.Context) []string {
	nodes, err := m.st.ListNodes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("listing nodes", "err", err)
		}
		return nil
	}
	slices.SortFunc(nodes, func(a, b api.Node) int { return strings.Compare(a.ID, b.ID) })
	now := time.Now()
	v := m.view
	v.mu.Lock()
	defer v.mu.Unlock()
	var appeared []string
	for _, n := range nodes {
		fresh := now.Sub(n.LastSeen) <= m.opt.NodeStale
		last, known := v.seen[n.ID]
		prev, heard := v.started[n.ID]
		restarted := heard && !n.StartedAt.Equal(prev)
		if fresh && (!known || now.Sub(last) > m.opt.NodeStale || restarted) {
			appeared = append(appeared, n.ID)
		}
		v.started[n.ID] = n.StartedAt
		if fresh {
			v.seen[n.ID] = now
		}
		if !n.LastSeen.Equal(v.beat[n.ID]) {
			v.beat[n.ID] = n.LastSeen
			v.placed[n.ID] = 0
		}
	}
	v.nodes = nodes
	return appeared
}

// lostNodes returns nodes not seen for NodeLost, forgetting them.
func (m *Manager) lostNodes(now time.Time) []string {
	v := m.view
	v.mu.Lock()
	defer v.mu.Unlock()
	var lost []string
	for id, last := range v.seen {
		if now.Sub(last) > m.opt.NodeLost {
			lost = append(lost, id)
			delete(v.seen, id)
		}
	}
	return lost
}

// nodeLoop refreshes the node view every second. On the leader it also
// reconciles nodes that appear (and every node now and then), fails the
// sandboxes of nodes that are gone for good, and drains.
func (m *Manager) nodeLoop(ctx context.Context) {
	defer m.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastAll time.Time
	for {
		appeared := m.refreshNodes(ctx)
		if !m.leases.leading() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			continue
		}
		reconcileAll := m.leases.tookLead() || time.Since(lastAll) > m.opt.ReconcileEvery
		if reconcileAll {
			lastAll = time.Now()
			m.watchRecordedNodes()
			// After a control-plane restart or a change of leader every
			// node needs a look, not only those that are new to this
			// process; and now and then, in case anything slipped
			// (a create's destroy that reached its node first).
			appeared = nil
			for _, n := range m.view.list() {
				if time.Since(n.LastSeen) <= m.opt.NodeStale {
					appeared = append(appeared, n.ID)
				}
			}
		}
		for _, id := range appeared {
			m.reconcile(ctx, id)
		}
		for _, id := range m.lostNodes(time.Now()) {
			m.failNode(ctx, id)
		}
		m.drainNodes(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchRecordedNodes starts the clock of nodes that records point at
// and this process has not seen (gone before it started, or before it
// led): unless they come back, their sandboxes fail after NodeLost.
func (m *Manager) watchRecordedNodes() {
	nodes := map[string]bool{}
	m.cache.each(func(rec *store.SandboxRecord) {
		if rec.Node != "" && sandbox.Live(rec.State) {
			nodes[rec.Node] = true
		}
	})
	now := time.Now()
	v := m.view
	v.mu.Lock()
	defer v.mu.Unlock()
	for n := range nodes {
		if _, ok := v.seen[n]; !ok {
			v.seen[n] = now
		}
	}
}
