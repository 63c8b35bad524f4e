package controlplane

import (
	"context"
	"github.com/dsec-dev/dsec/internal/testenv"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

func createReq() api.CreateSandboxRequest {
	return api.CreateSandboxRequest{Tier: api.TierFunction, Env: map[string]string{"A": "1"}, Labels: map[string]string{"l": "v"}}
}

// TestCreate: a create writes its record before it asks the node, and
// returns the sandbox running on the node it placed it on, with the
// request's defaults applied and the image resolved.
func TestCreate(t *testing.T) {
	h := newHarness(t, Options{})
	var pendingFirst bool
	h.nodes.onCreate = func(node string, req noderpc.CreateRequest) error {
		// If the control plane died now, reconciliation would find this.
		rec, _, err := h.st.GetSandbox(context.Background(), req.ID)
		pendingFirst = err == nil && rec.State == api.StatePending && rec.Node == node
		return nil
	}
	sb, err := h.m.Create(context.Background(), "o", createReq())
	if err != nil {
		t.Fatal(err)
	}
	if !pendingFirst {
		t.Error("the node was asked before the pending record was stored")
	}
	rec := h.st.record(t, sb.ID)
	if sb.State != api.StateRunning || rec.State != api.StateRunning || sb.Node != "n1" || rec.Owner != "o" || sb.Image != "fn" || sb.ImageID != "img-fn" {
		t.Errorf("sandbox %+v, record %s", sb, rec.State)
	}
	if d := time.Until(sb.ExpiresAt); sb.CPU != 1 || sb.MemoryMB != 256 || sb.TimeoutS != 300 || d < 290*time.Second || d > 300*time.Second {
		t.Errorf("defaults: cpu %g, memory %d, timeout %d, expires %v", sb.CPU, sb.MemoryMB, sb.TimeoutS, sb.ExpiresAt)
	}
	req := h.nodes.lastReq
	if req.ID != sb.ID || req.Tier != api.TierFunction || req.Env["A"] != "1" || req.Image.ID != "img-fn" || req.Image.Source != "dir:/images/fn" || req.DiskMB != 256 {
		t.Errorf("node request %+v", req)
	}
	if ev := h.st.eventsOf(sb.ID); !slices.Equal(ev, []string{">pending", "pending>running"}) {
		t.Errorf("events %v", ev)
	}
	if got, err := h.m.Get("o", sb.ID); err != nil || got.State != api.StateRunning {
		t.Errorf("Get = %+v, %v", got, err)
	}
}

// TestCreateRefusedBeforeNode: creates that fail validation, admission,
// image resolution or placement store nothing and reach no node.
func TestCreateRefusedBeforeNode(t *testing.T) {
	tests := []struct {
		name  string
		opt   Options
		nodes []api.Node
		req   func(r *api.CreateSandboxRequest)
		class errdefs.Class
		code  string
	}{
		{name: "unknown tier", req: func(r *api.CreateSandboxRequest) { r.Tier = "quantum" }, class: errdefs.Invalid, code: api.CodeUnknownTier},
		{name: "image missing", req: func(r *api.CreateSandboxRequest) { r.Image = "missing" }, class: errdefs.NotFound, code: api.CodeImageNotFound},
		{name: "image for another tier", opt: Options{Images: fakeImages{tiers: []string{api.TierContainer}}}, class: errdefs.Invalid, code: api.CodeImageTierMismatch},
		{name: "network on function", req: func(r *api.CreateSandboxRequest) { r.Network = &api.NetworkPolicy{Egress: api.EgressOpen} }, class: errdefs.Unsupported, code: api.CodeTierHasNoNetwork},
		{name: "no nodes", nodes: []api.Node{}, class: errdefs.Unavailable, code: api.CodeNoNodes},
		{name: "tier not offered", req: func(r *api.CreateSandboxRequest) { r.Tier, r.Image = api.TierVM, "x" }, class: errdefs.Unsupported, code: api.CodeTierUnavailable},
		{name: "nodes full", nodes: []api.Node{func() api.Node { n := testNode("n1", 2); n.Usage.Sandboxes = 2; return n }()}, class: errdefs.Unavailable, code: api.CodeCapacityExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.opt)
			if tt.nodes != nil {
				h.st.setNodes(tt.nodes...)
				h.m.refreshNodes(context.Background())
			}
			req := createReq()
			if tt.req != nil {
				tt.req(&req)
			}
			_, err := h.m.Create(context.Background(), "o", req)
			wantErr(t, err, tt.class, tt.code)
			if len(h.st.d.recs) != 0 || len(h.nodes.created()) != 0 {
				t.Errorf("records %d, node creates %v", len(h.st.d.recs), h.nodes.created())
			}
		})
	}
}

// TestCreateNodeAnswers: what the node's answer to a create leaves
// behind. A refusal (429) or an undone start (503) made nothing: the
// record goes, and the caller gets a retry hint. A node that did not
// answer in time (lost mid-create) may hold a half-made sandbox: it is
// asked to destroy it. Any other failure is final and stays on record.
func TestCreateNodeAnswers(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		class     errdefs.Class
		hint      time.Duration
		kept      bool // the record stays (failed)
		destroyed bool // the node is asked to destroy it
	}{
		{name: "refused", err: &errdefs.Error{Class: errdefs.RateLimited, Code: api.CodeOverloaded, Msg: "busy", RetryAfter: 3 * time.Second},
			class: errdefs.RateLimited, hint: 3 * time.Second},
		{name: "undone", err: errdefs.New(errdefs.Unavailable, api.CodeNodeResourcesExhausted, "short"), class: errdefs.Unavailable, hint: time.Second, destroyed: true},
		{name: "node lost mid-create", err: errdefs.New(errdefs.DeadlineExceeded, api.CodeNodeTimeout, "no answer"), class: errdefs.DeadlineExceeded, kept: true, destroyed: true},
		{name: "start failed", err: errdefs.New(errdefs.Internal, api.CodeSandboxStartFailed, "no"), class: errdefs.Internal, kept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			var id string
			h.nodes.onCreate = func(node string, req noderpc.CreateRequest) error { id = req.ID; return tt.err }
			_, err := h.m.Create(context.Background(), "o", createReq())
			if errdefs.ClassOf(err) != tt.class || errdefs.CodeOf(err) != errdefs.CodeOf(tt.err) || errdefs.RetryAfterOf(err) != tt.hint {
				t.Fatalf("error %v (%s, hint %v), want %s with hint %v", err, errdefs.ClassOf(err), errdefs.RetryAfterOf(err), tt.class, tt.hint)
			}
			if h.st.has(id) != tt.kept {
				t.Fatalf("record kept: %v, want %v", h.st.has(id), tt.kept)
			}
			if tt.kept {
				rec := h.st.record(t, id)
				if rec.State != api.StateFailed || !strings.HasPrefix(rec.Reason, "create failed: ") || rec.EndedAt == nil {
					t.Errorf("record %s (%q)", rec.State, rec.Reason)
				}
			} else if _, _, ok := h.m.cache.get(id); ok {
				t.Error("the forgotten record is still cached")
			}
			if got := h.nodes.destroyed(); (len(got) > 0) != tt.destroyed || tt.destroyed && got[0] != "n1/"+id {
				t.Errorf("destroys %v, want destroyed=%v", got, tt.destroyed)
			}
			if ev := h.st.eventsOf(id); !slices.Equal(ev, []string{">pending", "pending>failed"}) {
				t.Errorf("events %v", ev)
			}
			if h.m.cache.liveCount("o") != 0 {
				t.Errorf("%d live sandboxes counted", h.m.cache.liveCount("o"))
			}
		})
	}
}

// TestCreateRefusedIsNotPlacedElsewhere: a node's refusal goes back to
// the caller, who retries after the hint; the control plane does not try
// the next node itself. The refused placement no longer counts against
// the node, so the retry can go there.
func TestCreateRefusedIsNotPlacedElsewhere(t *testing.T) {
	h := newHarness(t, Options{})
	a, b := testNode("a", 1), testNode("b", 3)
	b.Usage.Sandboxes = 2 // a and b each have one free slot; a is first
	h.st.setNodes(a, b)
	h.m.refreshNodes(context.Background())
	refuse := true
	h.nodes.onCreate = func(node string, req noderpc.CreateRequest) error {
		if refuse {
			return &errdefs.Error{Class: errdefs.RateLimited, Code: api.CodeOverloaded, Msg: "busy", RetryAfter: time.Second}
		}
		return nil
	}
	_, err := h.m.Create(context.Background(), "o", createReq())
	wantErr(t, err, errdefs.RateLimited, api.CodeOverloaded)
	if c := h.nodes.created(); len(c) != 1 || !strings.HasPrefix(c[0], "a/") {
		t.Fatalf("node creates %v, want one, on a", c)
	}
	refuse = false
	sb, err := h.m.Create(context.Background(), "o", createReq())
	if err != nil || sb.Node != "a" {
		t.Fatalf("retry: %+v, %v; want it placed on a again", sb, err)
	}
}

// TestCreateSpreadsBetweenHeartbeats: creates placed since the nodes'
// last heartbeat count against them, so a burst spreads and then finds
// every node full, until a heartbeat says otherwise.
func TestCreateSpreadsBetweenHeartbeats(t *testing.T) {
	h := newHarness(t, Options{})
	b := testNode("b", 2)
	h.st.setNodes(testNode("a", 2), b)
	h.m.refreshNodes(context.Background())
	per := map[string]int{}
	for range 4 {
		sb, err := h.m.Create(context.Background(), "o", createReq())
		if err != nil {
			t.Fatal(err)
		}
		per[sb.Node]++
	}
	if per["a"] != 2 || per["b"] != 2 {
		t.Fatalf("placed %v, want 2 on each", per)
	}
	_, err := h.m.Create(context.Background(), "o", createReq())
	wantErr(t, err, errdefs.Unavailable, api.CodeCapacityExhausted)
	if errdefs.RetryAfterOf(err) <= 0 {
		t.Error("no retry hint")
	}
	// A new heartbeat from a, with room again, restarts its count; b's
	// is the same heartbeat as before.
	na := testNode("a", 2)
	na.LastSeen = time.Now().Add(time.Millisecond)
	na.Usage.Sandboxes = 1
	h.st.setNodes(na, b)
	h.m.refreshNodes(context.Background())
	if sb, err := h.m.Create(context.Background(), "o", createReq()); err != nil || sb.Node != "a" {
		t.Errorf("after a's heartbeat: %+v, %v", sb, err)
	}
}

// TestCreateStoreFails: a record that cannot be written stops the create
// before any node is asked, and releases its placement.
func TestCreateStoreFails(t *testing.T) {
	h := newHarness(t, Options{})
	h.st.setNodes(testNode("n1", 1))
	h.m.refreshNodes(context.Background())
	h.st.failCreate = storeTimeout
	_, err := h.m.Create(context.Background(), "o", createReq())
	wantErr(t, err, errdefs.DeadlineExceeded, api.CodeDeadlineExceeded)
	if len(h.nodes.created()) != 0 {
		t.Errorf("node creates %v", h.nodes.created())
	}
	h.st.failCreate = nil
	if _, err := h.m.Create(context.Background(), "o", createReq()); err != nil {
		t.Errorf("next create on the only node: %v (its slot was not released)", err)
	}
}

// TestCreateRefusedPurgeFails: if the record of a refused create cannot
// be removed, it is failed instead, so that it is not left pending.
func TestCreateRefusedPurgeFails(t *testing.T) {
	h := newHarness(t, Options{})
	var id string
	h.nodes.onCreate = func(node string, req noderpc.CreateRequest) error {
		id = req.ID
		return &errdefs.Error{Class: errdefs.RateLimited, Code: api.CodeOverloaded, Msg: "busy", RetryAfter: time.Second}
	}
	h.st.failPurge = storeTimeout
	_, err := h.m.Create(context.Background(), "o", createReq())
	wantErr(t, err, errdefs.RateLimited, api.CodeOverloaded)
	if rec := h.st.record(t, id); rec.State != api.StateFailed || !strings.HasPrefix(rec.Reason, "create refused: ") {
		t.Errorf("record %s (%q), want failed", rec.State, rec.Reason)
	}
}

// TestCreateDeletedMeanwhile: a sandbox deleted while its node creates
// it ends stopped; the create reports the conflict and the node is asked
// to destroy it.
func TestCreateDeletedMeanwhile(t *testing.T) {
	h := newHarness(t, Options{})
	inNode, proceed := make(chan string), make(chan struct{})
	h.nodes.onCreate = func(node string, req noderpc.CreateRequest) error {
		inNode <- req.ID
		hold(proceed)
		return nil
	}
	var wg sync.WaitGroup
	var cerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, cerr = h.m.Create(context.Background(), "o", createReq())
	}()
	id := testenv.Recv(t, inNode, wait, "the create to reach the node")
	if err := h.m.Delete(context.Background(), "o", id, "deleted"); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	testenv.WaitGroup(t, &wg, wait, "the create")
	wantErr(t, cerr, errdefs.Conflict, api.CodeSandboxStateChanged)
	rec := h.st.record(t, id)
	if rec.State != api.StateStopped || rec.Reason != "deleted" {
		t.Errorf("record %s (%q), want stopped", rec.State, rec.Reason)
	}
	if d := h.nodes.destroyed(); len(d) == 0 || d[0] != "n1/"+id {
		t.Errorf("destroys %v", d)
	}
}

// TestCreateOwnerLimits: an owner's live sandboxes and creates in flight
// are capped, and its creates rate-limited; a stopped sandbox frees its
// place; other owners are not affected.
func TestCreateOwnerLimits(t *testing.T) {
	h := newHarness(t, Options{Limits: Limits{MaxSandboxesPerOwner: 2}})
	var ids []string
	for range 2 {
		sb, err := h.m.Create(context.Background(), "o", createReq())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	_, err := h.m.Create(context.Background(), "o", createReq())
	wantErr(t, err, errdefs.RateLimited, api.CodeTooManySandboxes)
	if _, err := h.m.Create(context.Background(), "other", createReq()); err != nil {
		t.Errorf("another owner: %v", err)
	}
	if err := h.m.Delete(context.Background(), "o", ids[0], ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Create(context.Background(), "o", createReq()); err != nil {
		t.Errorf("after a delete: %v", err)
	}

	h = newHarness(t, Options{Limits: Limits{CreatesPerSecond: 0.001, CreateBurst: 1}})
	if _, err := h.m.Create(context.Background(), "o", createReq()); err != nil {
		t.Fatal(err)
	}
	_, err = h.m.Create(context.Background(), "o", createReq())
	wantErr(t, err, errdefs.RateLimited, api.CodeRateLimited)
	if errdefs.RetryAfterOf(err) <= 0 {
		t.Error("no retry hint")
	}
}

// TestCreateCountsInFlight: creates in flight count against the owner's
// cap before their records exist.
func TestCreateCountsInFlight(t *testing.T) {
	h := newHarness(t, Options{Limits: Limits{MaxSandboxesPerOwner: 1}})
	inNode, proceed := make(chan struct{}), make(chan struct{})
	h.nodes.onCreate = func(string, noderpc.CreateRequest) error {
		inNode <- struct{}{}
		hold(proceed)
		return nil
	}
	done := make(chan error)
	go func() {
		_, err := h.m.Create(context.Background(), "o", createReq())
		done <- err
	}()
	testenv.Recv(t, inNode, wait, "the first create to reach the node")
	h.nodes.onCreate = nil
	_, err := h.m.Create(context.Background(), "o", createReq())
	close(proceed)
	wantErr(t, err, errdefs.RateLimited, api.CodeTooManySandboxes)
	if err := testenv.Recv(t, done, wait, "the first create"); err != nil {
		t.Fatal(err)
	}
}

// TestStartLoadsRecordsAndFollowsOthers: Start loads the stored records
// and then applies other writers' changes as the watch delivers them,
// the manager's own being applied by the manager.
func TestStartLoadsRecordsAndFollowsOthers(t *testing.T) {
	h := newHarness(t, Options{Tick: time.Hour})
	other := h.st.peer()
	rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", Tier: api.TierFunction, State: api.StateRunning, Node: "n1",
		ExpiresAt: time.Now().Add(time.Hour)}, Owner: "o", StateSince: time.Now().Add(-time.Hour)}
	if _, err := other.CreateSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	h.nodes.run("n1", "sb-1")
	h.start(t)
	if got, err := h.m.Get("o", "sb-1"); err != nil || got.State != api.StateRunning {
		t.Fatalf("after Start: %+v, %v", got, err)
	}
	cur, rev, _ := other.GetSandbox(context.Background(), "sb-1")
	cur.Labels = map[string]string{"by": "other"}
	if _, err := other.UpdateSandbox(context.Background(), cur, rev); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.m.Get("o", "sb-1"); got.Labels["by"] != "other" {
		t.Errorf("after another writer's change: %v", got.Labels)
	}
	if err := other.PurgeSandbox(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Get("o", "sb-1"); errdefs.ClassOf(err) != errdefs.NotFound {
		t.Errorf("after a purge: %v", err)
	}
	if h.nodes.ended == nil {
		t.Error("Start did not serve the nodes' end reports")
	}
}
