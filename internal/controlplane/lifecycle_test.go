package controlplane

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

var allStates = []api.State{api.StatePending, api.StateRunning, api.StateStopping, api.StateStopped, api.StateFailed}

// TestTransitions: every pair of states, through the manager's
// transition: the lifecycle's moves are stored with their reason, an end
// time for the final states and an event; every other move is refused
// with invalid_state_transition and leaves the record as it was.
func TestTransitions(t *testing.T) {
	allowed := map[[2]api.State]bool{
		{api.StatePending, api.StateRunning}:  true,
		{api.StatePending, api.StateStopping}: true,
		{api.StatePending, api.StateFailed}:   true,
		{api.StateRunning, api.StateStopping}: true,
		{api.StateRunning, api.StateFailed}:   true,
		{api.StateStopping, api.StateStopped}: true,
		{api.StateStopping, api.StateFailed}:  true,
	}
	ctx := context.Background()
	for _, from := range allStates {
		for _, to := range allStates {
			t.Run(string(from)+"→"+string(to), func(t *testing.T) {
				h := newHarness(t, Options{})
				h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: from}})
				_, rev0, _ := h.st.GetSandbox(ctx, "sb-1")
				_, err := h.m.transition(ctx, "sb-1", from, to, "because")
				got := h.st.record(t, "sb-1")
				if !allowed[[2]api.State{from, to}] {
					wantErr(t, err, errdefs.Conflict, api.CodeInvalidStateTransition)
					if _, rev, _ := h.st.GetSandbox(ctx, "sb-1"); rev != rev0 || got.State != from {
						t.Errorf("refused move wrote the record: %s at %d (was %d)", got.State, rev, rev0)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got.State != to || got.Reason != "because" || (got.EndedAt != nil) != (to == api.StateStopped || to == api.StateFailed) {
					t.Errorf("record %s, reason %q, ended %v", got.State, got.Reason, got.EndedAt)
				}
				if time.Since(got.StateSince) > time.Minute {
					t.Errorf("state_since %v not updated", got.StateSince)
				}
				if c, _, _ := h.m.cache.get("sb-1"); c.State != to {
					t.Errorf("cache %s, store %s", c.State, to)
				}
				if ev := h.st.eventsOf("sb-1"); !slices.Equal(ev, []string{string(from) + ">" + string(to)}) {
					t.Errorf("events %v", ev)
				}
			})
		}
	}
}

// TestTransitionFromAnotherState: a transition whose from is not the
// record's state (someone moved it first) is refused as a state change.
func TestTransitionFromAnotherState(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateStopping}})
	_, err := h.m.transition(context.Background(), "sb-1", api.StatePending, api.StateRunning, "")
	wantErr(t, err, errdefs.Conflict, api.CodeSandboxStateChanged)
	if s := h.state(t, "sb-1"); s != api.StateStopping {
		t.Errorf("state %s", s)
	}
	_, err = h.m.transition(context.Background(), "sb-gone", api.StatePending, api.StateRunning, "")
	wantErr(t, err, errdefs.NotFound, api.CodeSandboxNotFound)
}

// TestOperationsByState: what each lifecycle operation does to a
// sandbox in each state, and whether it reaches the node.
func TestOperationsByState(t *testing.T) {
	ctx := context.Background()
	ops := map[string]func(h *harness) error{
		"delete":    func(h *harness) error { return h.m.Delete(ctx, "o", "sb-1", "deleted") },
		"fail":      func(h *harness) error { h.m.fail(ctx, "sb-1", "broken"); return nil },
		"set-ttl":   func(h *harness) error { _, err := h.m.SetTimeout(ctx, "o", "sb-1", 60); return err },
		"node-lost": func(h *harness) error { h.m.failNode(ctx, "n1"); return nil },
		"ended": func(h *harness) error {
			return h.m.sandboxEnded(ctx, noderpc.EndedReport{Node: "n1", ID: "sb-1", Reason: "agent_exited"})
		},
		"ended-else": func(h *harness) error {
			return h.m.sandboxEnded(ctx, noderpc.EndedReport{Node: "n9", ID: "sb-1", Reason: "agent_exited"})
		},
	}
	P, R, S, D, F := api.StatePending, api.StateRunning, api.StateStopping, api.StateStopped, api.StateFailed
	tests := []struct {
		op      string
		from    api.State
		want    api.State
		reason  string
		code    string // the error's code, if it fails
		destroy bool   // the node is asked to destroy it
	}{
		{"delete", P, D, "deleted", "", true},
		{"delete", R, D, "deleted", "", true},
		{"delete", S, D, "why", "", true}, // a stuck destroy is tried again
		{"delete", D, D, "why", "", false},
		{"delete", F, F, "why", "", false},
		{"fail", P, F, "broken", "", false},
		{"fail", R, F, "broken", "", false},
		{"fail", S, S, "why", "", false}, // left to its destroy
		{"fail", D, D, "why", "", false},
		{"fail", F, F, "why", "", false},
		{"set-ttl", P, P, "why", "", false},
		{"set-ttl", R, R, "why", "", false},
		{"set-ttl", S, S, "why", api.CodeSandboxNotRunning, false},
		{"set-ttl", D, D, "why", api.CodeSandboxNotRunning, false},
		{"set-ttl", F, F, "why", api.CodeSandboxNotRunning, false},
		{"node-lost", P, F, "node lost", "", false},
		{"node-lost", R, F, "node lost", "", false},
		{"node-lost", S, D, "node lost", "", false}, // nothing left to destroy
		{"node-lost", D, D, "why", "", false},
		{"node-lost", F, F, "why", "", false},
		{"ended", P, F, "agent_exited", "", false},
		{"ended", R, F, "agent_exited", "", false},
		{"ended", S, S, "why", "", false},
		{"ended", D, D, "why", "", false},
		{"ended", F, F, "why", "", false},
		{"ended-else", R, R, "why", "", false}, // another node's report
	}
	for _, tt := range tests {
		t.Run(tt.op+"/"+string(tt.from), func(t *testing.T) {
			h := newHarness(t, Options{})
			h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: tt.from, Reason: "why"}})
			h.nodes.run("n1", "sb-1")
			err := ops[tt.op](h)
			if tt.code != "" {
				wantErr(t, err, errdefs.Conflict, tt.code)
			} else if err != nil {
				t.Fatal(err)
			}
			got := h.st.record(t, "sb-1")
			if got.State != tt.want || got.Reason != tt.reason {
				t.Errorf("%s → %s (%q), want %s (%q)", tt.from, got.State, got.Reason, tt.want, tt.reason)
			}
			if destroyed := len(h.nodes.destroyed()) > 0; destroyed != tt.destroy {
				t.Errorf("node destroys %v, want destroyed=%v", h.nodes.destroyed(), tt.destroy)
			}
			if c, _, _ := h.m.cache.get("sb-1"); c.State != got.State {
				t.Errorf("cache %s, store %s", c.State, got.State)
			}
		})
	}
}

// TestDeleteNodeFails: a destroy the node cannot finish leaves the
// sandbox stopping (the reaper retries it) and reports the node's error.
func TestDeleteNodeFails(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}})
	h.nodes.onDestroy = func(node, id string) error { return nodeGone }
	err := h.m.Delete(context.Background(), "o", "sb-1", "deleted")
	wantErr(t, err, errdefs.Unavailable, api.CodeNodeUnavailable)
	if s := h.state(t, "sb-1"); s != api.StateStopping {
		t.Errorf("state %s, want stopping", s)
	}
}

// TestDeleteChecksOwner: another owner's sandbox is not found, and
// nothing happens to it.
func TestDeleteChecksOwner(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}, Owner: "alice"})
	err := h.m.Delete(context.Background(), "mallory", "sb-1", "")
	wantErr(t, err, errdefs.NotFound, api.CodeSandboxNotFound)
	if s := h.state(t, "sb-1"); s != api.StateRunning || len(h.nodes.destroyed()) != 0 {
		t.Errorf("state %s, destroys %v", s, h.nodes.destroyed())
	}
}

// TestSetTimeout: a new TTL counts from now and is bounded.
func TestSetTimeout(t *testing.T) {
	h := newHarness(t, Options{Limits: Limits{MaxTimeoutS: 100}})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}})
	for _, bad := range []int{0, -1, 101} {
		_, err := h.m.SetTimeout(context.Background(), "o", "sb-1", bad)
		wantErr(t, err, errdefs.Invalid, api.CodeOutOfRange)
	}
	sb, err := h.m.SetTimeout(context.Background(), "o", "sb-1", 100)
	if err != nil {
		t.Fatal(err)
	}
	rec := h.st.record(t, "sb-1")
	if d := time.Until(rec.ExpiresAt); rec.TimeoutS != 100 || d < 90*time.Second || d > 100*time.Second || !sb.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Errorf("timeout %d, expires in %v", rec.TimeoutS, d)
	}
}

// TestSandboxEndedUnknown: a report about a sandbox with no record is
// answered and changes nothing.
func TestSandboxEndedUnknown(t *testing.T) {
	h := newHarness(t, Options{})
	if err := h.m.sandboxEnded(context.Background(), noderpc.EndedReport{Node: "n1", ID: "sb-none"}); err != nil {
		t.Errorf("report of an unknown sandbox: %v", err)
	}
	if h.st.has("sb-none") {
		t.Error("a record appeared")
	}
}

// TestSandboxEndedChecksTheStoredNode: a report from a node that does
// not hold the sandbox changes nothing, even when the record is not yet
// cached (the check is repeated on the stored record).
func TestSandboxEndedChecksTheStoredNode(t *testing.T) {
	h := newHarness(t, Options{})
	rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", Tier: api.TierFunction, State: api.StateRunning, Node: "n1"}, Owner: "o"}
	if _, err := h.st.peer().CreateSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if err := h.m.sandboxEnded(context.Background(), endedReport("n2", "sb-1", "agent_exited")); err != nil {
		t.Fatal(err)
	}
	if s := h.state(t, "sb-1"); s != api.StateRunning {
		t.Errorf("another node's report: %s", s)
	}
	if err := h.m.sandboxEnded(context.Background(), endedReport("n1", "sb-1", "agent_exited")); err != nil {
		t.Fatal(err)
	}
	if s := h.state(t, "sb-1"); s != api.StateFailed {
		t.Errorf("its node's report: %s, want failed", s)
	}
}

// TestMutateRetriesOnConflict: a writer that got there between the
// manager's read and its write costs a retry, not its change: the
// record ends with both.
func TestMutateRetriesOnConflict(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}})
	other := h.st.peer()
	first := true
	h.st.beforeUpdate = func(id string) {
		if !first {
			return
		}
		first = false
		rec, rev, _ := other.GetSandbox(context.Background(), id)
		rec.Labels = map[string]string{"by": "other"}
		if _, err := other.UpdateSandbox(context.Background(), rec, rev); err != nil {
			t.Error(err)
		}
	}
	if err := h.m.Delete(context.Background(), "o", "sb-1", "deleted"); err != nil {
		t.Fatal(err)
	}
	got := h.st.record(t, "sb-1")
	if got.State != api.StateStopped || got.Labels["by"] != "other" {
		t.Errorf("record %s with labels %v: a change was lost", got.State, got.Labels)
	}
	if c, _, _ := h.m.cache.get("sb-1"); c.State != api.StateStopped || c.Labels["by"] != "other" {
		t.Errorf("cache %s %v", c.State, c.Labels)
	}
}

// TestMutateGivesUpUnderContention: a record that changes under every
// attempt fails the call as retryable, after casRetries writes.
func TestMutateGivesUpUnderContention(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}})
	other := h.st.peer()
	h.st.beforeUpdate = func(id string) {
		rec, rev, _ := other.GetSandbox(context.Background(), id)
		rec.TimeoutS++
		if _, err := other.UpdateSandbox(context.Background(), rec, rev); err != nil {
			t.Error(err)
		}
	}
	_, err := h.m.transition(context.Background(), "sb-1", api.StateRunning, api.StateFailed, "")
	wantErr(t, err, errdefs.Unavailable, api.CodeContention)
	if s := h.state(t, "sb-1"); s != api.StateRunning {
		t.Errorf("state %s", s)
	}
	if n := h.st.d.updates; n != 2*casRetries {
		t.Errorf("%d updates (the manager's and the other writer's), want %d", n, 2*casRetries)
	}
}

// TestCacheLagsStore: with the watch behind, the manager's cached
// revision is stale; its write conflicts, it reads through and succeeds,
// and the late delivery of the older change does not undo the newer one.
func TestCacheLagsStore(t *testing.T) {
	h := newHarness(t, Options{Tick: time.Hour})
	h.nodes.run("n1", "sb-1")
	rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", Tier: api.TierFunction, State: api.StateRunning, Node: "n1",
		ExpiresAt: time.Now().Add(time.Hour)}, Owner: "o", StateSince: time.Now().Add(-time.Hour)}
	other := h.st.peer()
	if _, err := other.CreateSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	h.st.hold()
	cur, rev, _ := other.GetSandbox(context.Background(), "sb-1")
	cur.Labels = map[string]string{"k": "v"}
	if _, err := other.UpdateSandbox(context.Background(), cur, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.SetTimeout(context.Background(), "o", "sb-1", 42); err != nil {
		t.Fatal(err)
	}
	h.st.release()
	c, crev, _ := h.m.cache.get("sb-1")
	got, grev, _ := h.st.GetSandbox(context.Background(), "sb-1")
	if c.TimeoutS != 42 || c.Labels["k"] != "v" || crev != grev || got.TimeoutS != 42 || got.Labels["k"] != "v" {
		t.Errorf("cache %d %v at %d, store %d %v at %d", c.TimeoutS, c.Labels, crev, got.TimeoutS, got.Labels, grev)
	}
}

// TestAmbiguousWriteRefreshes: a write that failed without saying
// whether it was stored (a timeout) makes the manager re-read the record,
// since its watch skips its own writes.
func TestAmbiguousWriteRefreshes(t *testing.T) {
	h := newHarness(t, Options{})
	h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning}})
	landed := h.st.peer()
	h.st.beforeUpdate = func(id string) {
		// The write reaches the store; its acknowledgement is lost.
		rec, rev, _ := landed.GetSandbox(context.Background(), id)
		rec.State = api.StateFailed
		_, _ = landed.UpdateSandbox(context.Background(), rec, rev)
	}
	h.st.failUpdate = context.DeadlineExceeded
	h.m.fail(context.Background(), "sb-1", "broken")
	if c, _, _ := h.m.cache.get("sb-1"); c.State != api.StateFailed {
		t.Errorf("cache %s after an ambiguous write, store failed", c.State)
	}
}

// TestSetPhase: phase changes go to the node first; the record follows
// only if the node applied it; a node that destroyed the sandbox rather
// than leave a phase half applied fails its record.
func TestSetPhase(t *testing.T) {
	phases := []api.Phase{{Name: "setup"}, {Name: "work"}, {Name: "grade"}}
	tests := []struct {
		name    string
		phases  []api.Phase
		req     api.SetPhaseRequest
		nodeErr error
		code    string
		phase   string // the record's phase after
		state   api.State
		node    bool // the node was asked
	}{
		{name: "forward", phases: phases, req: api.SetPhaseRequest{Phase: "grade"}, phase: "grade", state: api.StateRunning, node: true},
		{name: "same", phases: phases, req: api.SetPhaseRequest{Phase: "work"}, phase: "work", state: api.StateRunning},
		{name: "back refused", phases: phases, req: api.SetPhaseRequest{Phase: "setup"}, code: api.CodePhaseBackwards, phase: "work", state: api.StateRunning},
		{name: "back allowed", phases: phases, req: api.SetPhaseRequest{Phase: "setup", Back: true}, phase: "setup", state: api.StateRunning, node: true},
		{name: "unknown", phases: phases, req: api.SetPhaseRequest{Phase: "nope"}, code: api.CodeUnknownPhase, phase: "work", state: api.StateRunning},
		{name: "no phases", req: api.SetPhaseRequest{Phase: "work"}, code: api.CodeNoPhases, phase: "work", state: api.StateRunning},
		{name: "node busy", phases: phases, req: api.SetPhaseRequest{Phase: "grade"}, nodeErr: errdefs.New(errdefs.Unavailable, api.CodePhaseChangeBusy, "busy"),
			code: api.CodePhaseChangeBusy, phase: "work", state: api.StateRunning, node: true},
		{name: "node failed", phases: phases, req: api.SetPhaseRequest{Phase: "grade"}, nodeErr: errdefs.New(errdefs.Internal, api.CodePhaseChangeFailed, "half"),
			code: api.CodePhaseChangeFailed, phase: "work", state: api.StateFailed, node: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", State: api.StateRunning, Phases: tt.phases, Phase: "work"}})
			h.nodes.phaseErr = tt.nodeErr
			_, err := h.m.SetPhase(context.Background(), "o", "sb-1", tt.req)
			if tt.code != "" {
				if errdefs.CodeOf(err) != tt.code {
					t.Fatalf("error %v (%s), want %s", err, errdefs.CodeOf(err), tt.code)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			rec := h.st.record(t, "sb-1")
			if rec.Phase != tt.phase || rec.State != tt.state {
				t.Errorf("phase %s, state %s; want %s, %s", rec.Phase, rec.State, tt.phase, tt.state)
			}
			if asked := len(h.nodes.phases) > 0; asked != tt.node {
				t.Errorf("node asked: %v", h.nodes.phases)
			}
			if tt.code == "" && tt.node && (len(rec.PhaseHistory) != 1 || rec.PhaseHistory[0].Phase != tt.phase) {
				t.Errorf("history %+v", rec.PhaseHistory)
			}
		})
	}
}

// TestRoutesOnlyRunning: commands and files reach a sandbox's node only
// while it runs (the fake node panics if called).
func TestRoutesOnlyRunning(t *testing.T) {
	h := newHarness(t, Options{})
	for i, s := range []api.State{api.StatePending, api.StateStopping, api.StateStopped, api.StateFailed} {
		id := sbID(i)
		h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: id, State: s}})
		_, err := h.m.Exec(context.Background(), "o", id, api.ExecRequest{Command: "true"}, nil)
		wantErr(t, err, errdefs.Conflict, api.CodeSandboxNotRunning)
		_, err = h.m.StatFile(context.Background(), "o", id, "x")
		wantErr(t, err, errdefs.Conflict, api.CodeSandboxNotRunning)
	}
	_, err := h.m.Exec(context.Background(), "o", "sb-none", api.ExecRequest{Command: "true"}, nil)
	if !errors.Is(err, errdefs.NotFound) {
		t.Errorf("exec in a missing sandbox: %v", err)
	}
}
