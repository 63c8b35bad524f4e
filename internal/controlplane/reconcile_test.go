package controlplane

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/store"
)

// TestReconcileAfterRestart: a control plane started over records a
// previous one left compares them with what its node runs, once the node
// is seen: lost sandboxes fail, interrupted creates fail (and go from
// the node), unfinished destroys finish, orphans go; the rest is left.
func TestReconcileAfterRestart(t *testing.T) {
	h := newHarness(t, Options{Tick: time.Hour})
	old := time.Now().Add(-time.Hour).UTC()
	other := h.st.peer()
	type sb struct {
		state   api.State
		since   time.Time
		node    string
		present bool // the node runs it
	}
	sbs := map[string]sb{
		"sb-running":    {api.StateRunning, old, "n1", true},
		"sb-lost":       {api.StateRunning, old, "n1", false},
		"sb-late":       {api.StateRunning, time.Now().Add(time.Minute), "n1", false}, // running since after the list
		"sb-interrupt":  {api.StatePending, old, "n1", true},
		"sb-interrupt2": {api.StatePending, old, "n1", false},
		"sb-young":      {api.StatePending, time.Now().UTC(), "n1", false}, // another process creates it now
		"sb-stopping":   {api.StateStopping, old, "n1", true},
		"sb-stopped":    {api.StateStopped, old, "n1", true}, // still on the node: an orphan
		"sb-elsewhere":  {api.StateRunning, old, "n2", false},
	}
	for id, s := range sbs {
		rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: id, Tier: api.TierFunction, State: s.state, Node: s.node, Reason: "was",
			ExpiresAt: time.Now().Add(time.Hour)}, Owner: "o", StateSince: s.since}
		if _, err := other.CreateSandbox(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		if s.present {
			h.nodes.run(s.node, id)
		}
	}
	h.nodes.run("n1", "sb-orphan") // no record at all
	h.start(t)
	// Each once: an interrupted create is destroyed as such, not again
	// as an orphan (its record is no longer live by then).
	wantDestroyed := []string{"n1/sb-interrupt", "n1/sb-orphan", "n1/sb-stopped", "n1/sb-stopping"}
	destroyed := func() []string {
		d := h.nodes.destroyed()
		slices.Sort(d)
		return d
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(destroyed(), wantDestroyed) || h.state(t, "sb-stopping") != api.StateStopped {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for the reconciliation's destroys: destroyed %q (want %q), sb-stopping %s", destroyed(), wantDestroyed, h.state(t, "sb-stopping"))
		}
		time.Sleep(time.Millisecond)
	}

	want := map[string]struct {
		state  api.State
		reason string
	}{
		"sb-running":    {api.StateRunning, "was"},
		"sb-lost":       {api.StateFailed, "lost: its node no longer runs it"},
		"sb-late":       {api.StateRunning, "was"},
		"sb-interrupt":  {api.StateFailed, "interrupted: the control plane restarted during create"},
		"sb-interrupt2": {api.StateFailed, "interrupted: the control plane restarted during create"},
		"sb-young":      {api.StatePending, "was"},
		"sb-stopping":   {api.StateStopped, "was"},
		"sb-stopped":    {api.StateStopped, "was"},
		"sb-elsewhere":  {api.StateRunning, "was"}, // its node is not seen: not reconciled
	}
	for id, w := range want {
		if rec := h.st.record(t, id); rec.State != w.state || rec.Reason != w.reason {
			t.Errorf("%s: %s (%q), want %s (%q)", id, rec.State, rec.Reason, w.state, w.reason)
		}
	}
	if !h.nodes.runs("n1", "sb-running") {
		t.Error("a running sandbox was removed from its node")
	}
}

// TestReconcileSkipsCreatesInFlight: a pending record whose create this
// process is running is not an interrupted create, however old.
func TestReconcileSkipsCreatesInFlight(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StatePending}})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-2", State: api.StatePending}})
	h.m.trackCreate("sb-1", true)
	h.m.reconcile(context.Background(), "n1")
	if s := h.state(t, "sb-1"); s != api.StatePending {
		t.Errorf("in flight: %s", s)
	}
	if s := h.state(t, "sb-2"); s != api.StateFailed {
		t.Errorf("control: %s, want failed", s)
	}
}

// TestReconcileNodeUnreachable: a node that cannot list its sandboxes is
// not reconciled: nothing is failed or destroyed on a guess.
func TestReconcileNodeUnreachable(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}})
	h.nodes.listErr = nodeGone
	h.m.reconcile(context.Background(), "n1")
	if s := h.state(t, "sb-1"); s != api.StateRunning || len(h.nodes.destroyed()) != 0 {
		t.Errorf("state %s, destroys %v", s, h.nodes.destroyed())
	}
}

// TestNodesAppearAndAreLost: a node is reconciled when it appears, new
// or back after missing heartbeats; one unseen for NodeLost is lost once.
func TestNodesAppearAndAreLost(t *testing.T) {
	h := newHarness(t, Options{NodeStale: 10 * time.Second, NodeLost: time.Minute})
	h.m.view = newNodeView() // forget what newHarness saw
	ctx := context.Background()
	beat := func(ago time.Duration) {
		n := testNode("n1", 10)
		n.LastSeen = time.Now().Add(-ago)
		h.st.setNodes(n)
	}
	beat(0)
	if got := h.m.refreshNodes(ctx); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("first sight: appeared %v", got)
	}
	beat(0)
	if got := h.m.refreshNodes(ctx); len(got) != 0 {
		t.Fatalf("next heartbeat: appeared %v", got)
	}
	beat(time.Minute) // its heartbeats stopped a minute ago
	if got := h.m.refreshNodes(ctx); len(got) != 0 {
		t.Fatalf("stale: appeared %v", got)
	}
	// A minute later, as the view then holds it.
	h.m.view.mu.Lock()
	h.m.view.seen["n1"] = time.Now().Add(-time.Minute)
	h.m.view.mu.Unlock()
	beat(0)
	if got := h.m.refreshNodes(ctx); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("back: appeared %v", got)
	}
	if lost := h.m.lostNodes(time.Now()); len(lost) != 0 {
		t.Errorf("lost %v while heartbeating", lost)
	}
	if lost := h.m.lostNodes(time.Now().Add(2 * time.Minute)); !slices.Equal(lost, []string{"n1"}) {
		t.Errorf("lost %v, want n1", lost)
	}
	if lost := h.m.lostNodes(time.Now().Add(3 * time.Minute)); len(lost) != 0 {
		t.Errorf("lost %v again", lost)
	}
}

// TestNodeLostFailsItsSandboxes: the node loop fails the sandboxes of a
// node unseen for NodeLost, and leaves other nodes' alone.
func TestNodeLostFailsItsSandboxes(t *testing.T) {
	h := newHarness(t, Options{Tick: time.Hour, NodeStale: time.Minute, NodeLost: 300 * time.Millisecond})
	other := h.st.peer()
	for _, r := range []struct{ id, node string }{{"sb-1", "n1"}, {"sb-2", "n2"}} {
		rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: r.id, Tier: api.TierFunction, State: api.StateRunning, Node: r.node,
			ExpiresAt: time.Now().Add(time.Hour)}, Owner: "o", StateSince: time.Now().Add(-time.Hour)}
		if _, err := other.CreateSandbox(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		h.nodes.run(r.node, r.id)
	}
	n2 := testNode("n2", 10)
	h.st.setNodes(testNode("n1", 10), n2)
	h.start(t)
	// n1's heartbeats stop; n2's last one is still fresh.
	n1 := testNode("n1", 10)
	n1.LastSeen = time.Now().Add(-time.Hour)
	h.st.setNodes(n1, n2)
	waitFor(t, "n1's sandbox to fail", func() bool { return h.state(t, "sb-1") == api.StateFailed })
	if rec := h.st.record(t, "sb-1"); rec.Reason != "node lost" {
		t.Errorf("reason %q", rec.Reason)
	}
	if s := h.state(t, "sb-2"); s != api.StateRunning {
		t.Errorf("n2's sandbox: %s", s)
	}
}

// TestEndedReportsReachTheRecord: a node's report that a sandbox ended
// by itself, through the handler Start registers, fails its record.
func TestEndedReportsReachTheRecord(t *testing.T) {
	h := newHarness(t, Options{Tick: time.Hour})
	h.nodes.run("n1", "sb-1")
	other := h.st.peer()
	rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", Tier: api.TierFunction, State: api.StateRunning, Node: "n1",
		ExpiresAt: time.Now().Add(time.Hour)}, Owner: "o", StateSince: time.Now().Add(-time.Hour)}
	if _, err := other.CreateSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	h.nodes.mu.Lock()
	report := h.nodes.ended
	h.nodes.mu.Unlock()
	if err := report(endedReport("n1", "sb-1", "guest_panicked: oops")); err != nil {
		t.Fatal(err)
	}
	got := h.st.record(t, "sb-1")
	if got.State != api.StateFailed || !strings.HasPrefix(got.Reason, "guest_panicked") {
		t.Errorf("record %s (%q)", got.State, got.Reason)
	}
}
