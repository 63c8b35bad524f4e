package controlplane

import (
	"context"
	"github.com/dsec-dev/dsec/internal/testenv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

func endedReport(node, id, reason string) noderpc.EndedReport {
	return noderpc.EndedReport{Node: node, ID: id, Tier: api.TierFunction, Reason: reason, Time: time.Now()}
}

// reapAt runs one sweep of the reaper as if at now, and waits for the
// work it started.
func (h *harness) reapAt(now time.Time) {
	h.m.reap(context.Background(), now)
	testenv.WaitGroup(h.t, &h.m.wg, wait, "the reaper's work")
}

// TestReap: one sweep expires live sandboxes past their TTL, retries
// destroys stuck in stopping, and purges ended records past retention.
func TestReap(t *testing.T) {
	h := newHarness(t, Options{Limits: Limits{Retention: 10 * time.Minute}})
	now := time.Now()
	tests := []struct {
		id        string
		state     api.State
		expires   time.Time
		since     time.Time
		want      api.State // "" : purged
		reason    string
		destroyed bool
	}{
		{"sb-expired", api.StateRunning, now.Add(-time.Second), now.Add(-time.Hour), api.StateStopped, "expired", true},
		{"sb-expired-pending", api.StatePending, now.Add(-time.Second), now.Add(-time.Hour), api.StateStopped, "expired", true},
		{"sb-live", api.StateRunning, now.Add(time.Minute), now.Add(-time.Hour), api.StateRunning, "", false},
		{"sb-stuck", api.StateStopping, now.Add(-time.Hour), now.Add(-retryStopping - time.Second), api.StateStopped, "", true},
		{"sb-stopping", api.StateStopping, now.Add(-time.Hour), now.Add(-time.Second), api.StateStopping, "", false},
		{"sb-old-stopped", api.StateStopped, now.Add(-time.Hour), now.Add(-11 * time.Minute), "", "", false},
		{"sb-old-failed", api.StateFailed, now.Add(-time.Hour), now.Add(-11 * time.Minute), "", "", false},
		{"sb-new-stopped", api.StateStopped, now.Add(-time.Hour), now.Add(-9 * time.Minute), api.StateStopped, "", false},
	}
	for _, tt := range tests {
		h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: tt.id, State: tt.state, ExpiresAt: tt.expires}, StateSince: tt.since})
		h.nodes.run("n1", tt.id)
	}
	h.reapAt(now)
	destroyed := map[string]bool{}
	for _, d := range h.nodes.destroyed() {
		destroyed[d] = true
	}
	for _, tt := range tests {
		if tt.want == "" {
			if h.st.has(tt.id) {
				t.Errorf("%s: not purged", tt.id)
			}
		} else if rec := h.st.record(t, tt.id); rec.State != tt.want || rec.Reason != tt.reason {
			t.Errorf("%s: %s (%q), want %s (%q)", tt.id, rec.State, rec.Reason, tt.want, tt.reason)
		}
		if destroyed["n1/"+tt.id] != tt.destroyed {
			t.Errorf("%s: destroyed on node %v, want %v", tt.id, destroyed["n1/"+tt.id], tt.destroyed)
		}
	}
}

// TestReapRetriesFailedDestroys: an expiry whose destroy the node cannot
// do now stays stopping; a later sweep, once retryStopping has passed,
// finishes it.
func TestReapRetriesFailedDestroys(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning, ExpiresAt: time.Now().Add(-time.Second)}})
	var fail atomic.Bool
	fail.Store(true)
	h.nodes.onDestroy = func(node, id string) error {
		if fail.Load() {
			return errdefs.New(errdefs.Unavailable, api.CodeDestroyIncomplete, "not yet")
		}
		return nil
	}
	h.reapAt(time.Now())
	if s := h.state(t, "sb-1"); s != api.StateStopping {
		t.Fatalf("after a failed destroy: %s", s)
	}
	h.reapAt(time.Now()) // too soon to retry
	if n := len(h.nodes.destroyed()); n != 1 {
		t.Errorf("%d destroys before retryStopping passed", n)
	}
	fail.Store(false)
	h.reapAt(time.Now().Add(retryStopping + time.Second))
	if s := h.state(t, "sb-1"); s != api.StateStopped {
		t.Errorf("after the retry: %s", s)
	}
	if n := len(h.nodes.destroyed()); n != 2 {
		t.Errorf("%d destroys, want 2", n)
	}
}

// TestReapOneDestroyAtATime: a sweep does not start a second destroy of
// a sandbox whose destroy is still running.
func TestReapOneDestroyAtATime(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning, ExpiresAt: time.Now().Add(-time.Second)}})
	entered, proceed := make(chan struct{}, 2), make(chan struct{})
	h.nodes.onDestroy = func(node, id string) error {
		entered <- struct{}{}
		hold(proceed)
		return nil
	}
	h.m.reap(context.Background(), time.Now())
	testenv.Recv(t, entered, wait, "the destroy to reach the node")
	// Later, the sandbox looks stuck in stopping: its destroy is retried,
	// unless one is running.
	h.m.reap(context.Background(), time.Now().Add(retryStopping+time.Second))
	close(proceed)
	testenv.WaitGroup(t, &h.m.wg, wait, "the reaper's work")
	if n := len(h.nodes.destroyed()); n != 1 {
		t.Errorf("%d destroys of one sandbox at once", n)
	}
	if s := h.state(t, "sb-1"); s != api.StateStopped {
		t.Errorf("state %s", s)
	}
}

// TestReapLoop: the started manager sweeps every Tick.
func TestReapLoop(t *testing.T) {
	h := newHarness(t, Options{Tick: 10 * time.Millisecond})
	h.nodes.run("n1", "sb-1")
	rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", Tier: api.TierFunction, State: api.StateRunning, Node: "n1",
		ExpiresAt: time.Now().Add(100 * time.Millisecond)}, Owner: "o", StateSince: time.Now().Add(-time.Hour)}
	if _, err := h.st.peer().CreateSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	waitFor(t, "the sandbox to expire", func() bool { return h.state(t, "sb-1") == api.StateStopped })
	if h.nodes.runs("n1", "sb-1") {
		t.Error("the node still runs the expired sandbox")
	}
}
