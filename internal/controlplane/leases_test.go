package controlplane

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/testenv"
)

const testLeaseTTL = time.Second

// leaseStoreForTest is the real store's lease bucket, with a short TTL.
func leaseStoreForTest(t *testing.T) *store.Store {
	t.Helper()
	nc, _ := testenv.NATS(t)
	st, err := store.Open(context.Background(), nc, store.Options{LeaseTTL: testLeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLeaderElection: of two servers one leads; when it stops cleanly
// the other leads at its next renewal; when one dies (stops renewing)
// the other leads once its lease lapses, and not before half of it.
func TestLeaderElection(t *testing.T) {
	st := leaseStoreForTest(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	a := newLeases(st, "a", testLeaseTTL)
	b := newLeases(st, "b", testLeaseTTL)
	a.renew(ctx, log)
	b.renew(ctx, log)
	if !a.leading() || b.leading() {
		t.Fatalf("a leading %v, b leading %v: want a alone", a.leading(), b.leading())
	}
	if !a.tookLead() || a.tookLead() {
		t.Fatal("tookLead: want true once")
	}
	a.renew(ctx, log) // now a has seen b's lease
	if b.creatorGone("a", a.incarnation, time.Time{}) || a.creatorGone("b", b.incarnation, time.Time{}) || a.creatorGone("c", "1", time.Time{}) {
		t.Fatal("creatorGone: a and b hold leases, and c is not gone before a TTL passed")
	}
	if !a.creatorGone("a", "earlier", time.Time{}) {
		t.Fatal("creatorGone: an earlier run of this server is not gone")
	}

	// a stops cleanly: b takes over at once.
	a.release(ctx)
	if a.leading() {
		t.Fatal("a leads after releasing")
	}
	b.renew(ctx, log)
	if !b.leading() {
		t.Fatal("b does not lead after a released the lead")
	}

	// b dies: it stops renewing. a (restarted as a new run) must not
	// lead while b's lease lives, and leads after it lapsed.
	died := time.Now()
	a = newLeases(st, "a", testLeaseTTL)
	a.renew(ctx, log)
	if a.leading() {
		t.Fatal("a leads while b's lease lives")
	}
	testenv.Eventually(t, 10*time.Second, "a to lead after b's lease lapsed", func() bool {
		a.renew(ctx, log)
		return a.leading()
	})
	if since := time.Since(died); since < testLeaseTTL/2 {
		t.Fatalf("a led %v after b's last renewal, before b could have stopped acting", since)
	}
	if b.leading() {
		t.Fatal("b still acts as leader past half its lease")
	}
	testenv.Eventually(t, 10*time.Second, "b to be gone a TTL after its lease was last seen", func() bool {
		a.renew(ctx, log)
		return a.creatorGone("b", b.incarnation, time.Time{}) && a.creatorGone("c", "1", time.Time{})
	})

	// A restart of the leader (same name, new run) takes its lead back
	// at once, without waiting for the lease to lapse.
	a2 := newLeases(st, "a", testLeaseTTL)
	a2.renew(ctx, log)
	if !a2.leading() {
		t.Fatal("a restarted does not take its lead back")
	}
}

// TestOrphanedCreates: the leader completes a gone server's create that
// its node made, fails one its node does not have, and leaves a live
// server's create alone.
func TestOrphanedCreates(t *testing.T) {
	st := leaseStoreForTest(t)
	ctx := context.Background()
	h := newHarness(t, Options{Name: "a", Leases: st, LeaseTTL: testLeaseTTL})
	b := newLeases(st, "b", testLeaseTTL)
	b.renew(ctx, slog.New(slog.DiscardHandler))
	h.m.leases.renew(ctx, h.m.log)
	// A server is gone once its lease has not been seen for a TTL.
	time.Sleep(testLeaseTTL + 100*time.Millisecond)
	b.renew(ctx, slog.New(slog.DiscardHandler))
	h.m.leases.renew(ctx, h.m.log)

	made := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: sbID(1), State: api.StatePending}, Creator: "gone"})
	h.nodes.run("n1", made.ID)
	lost := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: sbID(2), State: api.StatePending}, Creator: "gone"})
	theirs := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: sbID(3), State: api.StatePending}, Creator: "b", CreatorRun: b.incarnation})
	// A create of this server's previous run (killed): its own.
	mine := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: sbID(5), State: api.StatePending}, Creator: "a", CreatorRun: "earlier"})
	h.nodes.run("n1", mine.ID)
	h.nodes.run("n1", theirs.ID)

	// A server that started after the last read of the leases: its
	// create, just begun, is not judged.
	fresh := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: sbID(6), State: api.StatePending}, Creator: "new",
		CreatorRun: "1", StateSince: time.Now().UTC()})
	h.m.finishOrphanedCreates(ctx, time.Now())
	if got := h.st.record(t, fresh.ID); got.State != api.StatePending {
		t.Errorf("a create just begun by a server not yet seen: %s (%q), want left pending", got.State, got.Reason)
	}
	if got := h.st.record(t, made.ID); got.State != api.StateRunning || !strings.Contains(got.Reason, "server gone stopped") {
		t.Errorf("made by its node: %s (%q), want running, completed by a", got.State, got.Reason)
	}
	if got := h.st.record(t, lost.ID); got.State != api.StateFailed || !strings.Contains(got.Reason, "interrupted: server gone") {
		t.Errorf("not on its node: %s (%q), want failed", got.State, got.Reason)
	}
	if got := h.st.record(t, theirs.ID); got.State != api.StatePending {
		t.Errorf("a live server's create: %s, want left pending", got.State)
	}
	if got := h.st.record(t, mine.ID); got.State != api.StateRunning {
		t.Errorf("this server's previous run's create, made by its node: %s (%q), want running", got.State, got.Reason)
	}
	// A full reconcile leaves it too, and does not take its sandbox
	// for an orphan.
	h.m.reconcile(ctx, "n1")
	if got := h.st.record(t, theirs.ID); got.State != api.StatePending {
		t.Errorf("a live server's create after reconcile: %s, want pending", got.State)
	}
	h.nodes.mu.Lock()
	_, kept := h.nodes.running["n1"][theirs.ID]
	h.nodes.mu.Unlock()
	if !kept {
		t.Error("reconcile destroyed a live server's sandbox")
	}
	// Without the lead, nothing is done.
	h.m.leases.release(ctx)
	gone2 := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: sbID(4), State: api.StatePending}, Creator: "gone"})
	h.m.reap(ctx, time.Now().Add(time.Minute))
	if got := h.st.record(t, gone2.ID); got.State != api.StatePending {
		t.Errorf("a server that does not lead finished an orphaned create: %s", got.State)
	}
}

// TestNodeRestartAppears: a node whose process restarted between two
// heartbeats (never stale) is reconciled as one that came back.
func TestNodeRestartAppears(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := context.Background()
	n := testNode("n1", 10)
	n.StartedAt = time.Now().Add(-time.Hour)
	h.st.setNodes(n)
	h.m.refreshNodes(ctx)
	if got := h.m.refreshNodes(ctx); len(got) != 0 {
		t.Fatalf("an unchanged node appeared again: %v", got)
	}
	n.StartedAt, n.LastSeen = time.Now(), time.Now()
	h.st.setNodes(n)
	if got := h.m.refreshNodes(ctx); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("a restarted node: appeared %v, want [n1]", got)
	}
}
