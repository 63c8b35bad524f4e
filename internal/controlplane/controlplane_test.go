package controlplane

import (
	"errors"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

func TestValidateFillsDefaultsAndBounds(t *testing.T) {
	m := New(Options{Limits: Limits{DefaultImages: map[string]string{"function": "wasm-tools"}}})
	req := api.CreateSandboxRequest{}
	if err := m.validate(&req); err != nil {
		t.Fatal(err)
	}
	if req.Tier != "function" || req.Image != "wasm-tools" || req.CPU != 1 || req.MemoryMB != 256 || req.DiskMB != 256 || req.TimeoutS != 300 {
		t.Errorf("defaults: %+v", req)
	}
	bad := []api.CreateSandboxRequest{
		{Tier: "quantum"},
		{Tier: "container"}, // no default image for it
		{CPU: -1},
		{CPU: 1000},
		{MemoryMB: -5},
		{TimeoutS: 86401},
		{Labels: map[string]string{"bad key!": "v"}},
		{Env: map[string]string{"1BAD": "v"}},
		{Env: map[string]string{"OK": "nul\x00byte"}},
	}
	for _, b := range bad {
		if err := m.validate(&b); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("validate(%+v) = %v, want Invalid", b, err)
		}
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	sb := api.Sandbox{ID: "sb-x", CreatedAt: time.Date(2026, 11, 30, 1, 2, 3, 456, time.UTC)}
	got, err := decodePageToken(encodePageToken(sb))
	if err != nil || got.ID != sb.ID || !got.CreatedAt.Equal(sb.CreatedAt) {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	for _, bad := range []string{"!!!", "bm90LWEtdG9rZW4", "eHw"} {
		if _, err := decodePageToken(bad); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("decodePageToken(%q) = %v, want Invalid", bad, err)
		}
	}
}

func TestCacheKeepsNewestRevisionAndCounts(t *testing.T) {
	c := newCache()
	rec := func(state api.State) store.SandboxRecord {
		return store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-1", Tier: "function", State: state}, Owner: "o"}
	}
	c.apply(rec(api.StateRunning), 5)
	c.apply(rec(api.StatePending), 4) // older: ignored
	if got, rev, _ := c.get("sb-1"); got.State != api.StateRunning || rev != 5 {
		t.Errorf("after an older revision: %s at %d", got.State, rev)
	}
	if c.liveCount("o") != 1 || c.counts()[[2]string{"function", "running"}] != 1 {
		t.Errorf("counts: live %d, %v", c.liveCount("o"), c.counts())
	}
	c.apply(rec(api.StateStopped), 6)
	if c.liveCount("o") != 0 || c.counts()[[2]string{"function", "stopped"}] != 1 || len(c.counts()) != 1 {
		t.Errorf("after stop: live %d, %v", c.liveCount("o"), c.counts())
	}
	c.remove("sb-1", 6) // not newer: kept
	if _, _, ok := c.get("sb-1"); !ok {
		t.Error("remove at an old revision dropped the record")
	}
	c.remove("sb-1", 7)
	if _, _, ok := c.get("sb-1"); ok || len(c.counts()) != 0 {
		t.Errorf("remove failed: %v", c.counts())
	}
}

func TestListOrderFilterAndPaging(t *testing.T) {
	m := New(Options{})
	base := time.Now()
	for i, owner := range []string{"a", "a", "b", "a"} {
		r := store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-" + string(rune('0'+i)), Tier: "function", State: api.StateRunning,
			CreatedAt: base.Add(time.Duration(i) * time.Second), Labels: map[string]string{"i": string(rune('0' + i%2))}}, Owner: owner}
		m.cache.apply(r, uint64(i+1))
	}
	l, err := m.List("a", ListOptions{Limit: 2})
	if err != nil || len(l.Sandboxes) != 2 || l.Sandboxes[0].ID != "sb-3" || l.Sandboxes[1].ID != "sb-1" || l.NextPageToken == "" {
		t.Fatalf("page 1 = %+v, %v", l, err)
	}
	l2, err := m.List("a", ListOptions{Limit: 2, PageToken: l.NextPageToken})
	if err != nil || len(l2.Sandboxes) != 1 || l2.Sandboxes[0].ID != "sb-0" || l2.NextPageToken != "" {
		t.Errorf("page 2 = %+v, %v", l2, err)
	}
	l3, _ := m.List("a", ListOptions{Labels: map[string]string{"i": "1"}})
	if len(l3.Sandboxes) != 2 {
		t.Errorf("label filter = %+v", l3)
	}
	if _, err := m.Get("b", "sb-0"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("another owner's sandbox: %v, want NotFound", err)
	}
}

func TestOversight(t *testing.T) {
	nodes := []api.Node{{ID: "n1", Monitor: "on", Tiers: []api.TierInfo{
		{Name: "container", Available: true},
		{Name: "microvm", Available: true, GuestKernel: true, GuestEnforced: []string{"writable", "user", "capabilities", "processes"}},
	}}, {ID: "n2", Monitor: "off", Tiers: []api.TierInfo{{Name: "container", Available: true}}}}
	for _, tc := range []struct {
		node, tier string
		monitored  bool
		guest      int
	}{
		{"n1", "container", true, 0}, // control: the same node watches its containers
		{"n1", "microvm", false, 4},
		{"n2", "container", false, 0},
		{"gone", "container", false, 0},
	} {
		mon, guest := oversight(nodes, tc.node, tc.tier)
		if mon != tc.monitored || len(guest) != tc.guest || guest == nil {
			t.Errorf("oversight(%s, %s) = %v, %v; want %v and %d parts", tc.node, tc.tier, mon, guest, tc.monitored, tc.guest)
		}
	}
}

// TestRetryableCreateErrors: a node's 429 and 503 answers to a create
// mean nothing was made and carry a retry hint to the API (one second if
// the node gave none); other failures are final.
func TestRetryableCreateErrors(t *testing.T) {
	for _, tt := range []struct {
		err       error
		retryable bool
		hint      time.Duration
	}{
		{&errdefs.Error{Class: errdefs.RateLimited, Code: "overloaded", Msg: "busy", RetryAfter: 3 * time.Second}, true, 3 * time.Second},
		{errdefs.New(errdefs.Unavailable, "agent_gone", "gone"), true, time.Second},
		{errdefs.New(errdefs.Internal, "sandbox_start_failed", "no"), false, 0},
		{errdefs.New(errdefs.DeadlineExceeded, "node_timeout", "slow"), false, 0},
	} {
		if got := retryable(tt.err); got != tt.retryable {
			t.Errorf("retryable(%v) = %v", tt.err, got)
			continue
		}
		if !tt.retryable {
			continue
		}
		err := withRetryHint(tt.err)
		if errdefs.RetryAfterOf(err) != tt.hint || errdefs.CodeOf(err) != errdefs.CodeOf(tt.err) || errdefs.ClassOf(err) != errdefs.ClassOf(tt.err) {
			t.Errorf("withRetryHint(%v) = %v (%s, %v), want the same error with hint %v", tt.err, err, errdefs.CodeOf(err), errdefs.RetryAfterOf(err), tt.hint)
		}
	}
}
