package scheduler

import (
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func node(id string, tiers []string, max, used int, load float64, seen time.Time) api.Node {
	n := api.Node{ID: id, Ready: true, LastSeen: seen, Capacity: api.Capacity{MaxSandboxes: max}, Usage: api.Usage{Sandboxes: used, Load1: load}}
	for _, t := range tiers {
		n.Tiers = append(n.Tiers, api.TierInfo{Name: t, Available: true})
	}
	return n
}

func TestPick(t *testing.T) {
	now := time.Now()
	fn := []string{"function"}
	old := now.Add(-time.Hour)
	notReady := node("a", fn, 10, 0, 0, now)
	notReady.Ready = false
	unavailable := node("a", fn, 10, 0, 0, now)
	unavailable.Tiers[0].Available = false // fingerprinted, cannot run here
	tests := []struct {
		name    string
		nodes   []api.Node
		pending map[string]int
		prefer  string
		avoid   string
		want    string
		class   errdefs.Class
		code    string
	}{
		{name: "most free slots", nodes: []api.Node{node("a", fn, 10, 8, 0, now), node("b", fn, 10, 2, 0, now)}, want: "b"},
		{name: "free slots before load", nodes: []api.Node{node("a", fn, 10, 5, 0, now), node("b", fn, 10, 4, 9, now)}, want: "b"},
		{name: "pending counts", nodes: []api.Node{node("a", fn, 10, 2, 0, now), node("b", fn, 10, 1, 0, now)}, pending: map[string]int{"b": 5}, want: "a"},
		{name: "pending fills", nodes: []api.Node{node("a", fn, 2, 0, 0, now), node("b", fn, 10, 9, 0, now)}, pending: map[string]int{"a": 2}, want: "b"},
		{name: "tie by load", nodes: []api.Node{node("a", fn, 10, 0, 1.5, now), node("b", fn, 10, 0, 0.5, now)}, want: "b"},
		{name: "full tie goes to the first", nodes: []api.Node{node("a", fn, 10, 0, 1, now), node("b", fn, 10, 0, 1, now)}, want: "a"},
		{name: "full tie goes to the first, reversed", nodes: []api.Node{node("b", fn, 10, 0, 1, now), node("a", fn, 10, 0, 1, now)}, want: "b"},
		{name: "stale skipped", nodes: []api.Node{node("a", fn, 10, 0, 0, old), node("b", fn, 10, 9, 0, now)}, want: "b"},
		{name: "not ready skipped", nodes: []api.Node{notReady, node("b", fn, 10, 9, 0, now)}, want: "b"},
		{name: "full skipped", nodes: []api.Node{node("a", fn, 10, 10, 0, now), node("b", fn, 10, 9, 5, now)}, want: "b"},
		{name: "over full skipped", nodes: []api.Node{node("a", fn, 10, 12, 0, now), node("b", fn, 10, 9, 5, now)}, want: "b"},
		{name: "other tier skipped", nodes: []api.Node{node("a", []string{"container"}, 10, 0, 0, now), node("b", []string{"container", "function"}, 10, 9, 0, now)}, want: "b"},
		{name: "wrong tier", nodes: []api.Node{node("a", []string{"container"}, 10, 0, 0, now)}, class: errdefs.Unsupported, code: api.CodeTierUnavailable},
		{name: "tier unavailable on the node", nodes: []api.Node{unavailable}, class: errdefs.Unsupported, code: api.CodeTierUnavailable},
		{name: "tier only on a stale node", nodes: []api.Node{node("a", fn, 10, 0, 0, old), node("b", []string{"container"}, 10, 0, 0, now)}, class: errdefs.Unsupported, code: api.CodeTierUnavailable},
		{name: "full", nodes: []api.Node{node("a", fn, 2, 2, 0, now)}, class: errdefs.Unavailable, code: api.CodeCapacityExhausted},
		{name: "full with pending", nodes: []api.Node{node("a", fn, 2, 1, 0, now)}, pending: map[string]int{"a": 1}, class: errdefs.Unavailable, code: api.CodeCapacityExhausted},
		{name: "preferred node wins", nodes: []api.Node{node("a", fn, 10, 8, 0, now), node("b", fn, 10, 2, 0, now)}, prefer: "a", want: "a"},
		{name: "preferred node full", nodes: []api.Node{node("a", fn, 10, 10, 0, now), node("b", fn, 10, 2, 0, now)}, prefer: "a", want: "b"},
		{name: "preferred node without the tier", nodes: []api.Node{node("a", []string{"container"}, 10, 0, 0, now), node("b", fn, 10, 2, 0, now)}, prefer: "a", want: "b"},
		{name: "avoided node skipped", nodes: []api.Node{node("a", fn, 10, 0, 0, now), node("b", fn, 10, 9, 0, now)}, avoid: "a", want: "b"},
		{name: "only the avoided node", nodes: []api.Node{node("a", fn, 10, 0, 0, now)}, avoid: "a", class: errdefs.Unavailable, code: api.CodeCapacityExhausted},
		{name: "none", class: errdefs.Unavailable, code: api.CodeNoNodes},
		{name: "none connected", nodes: []api.Node{node("a", fn, 10, 0, 0, old), notReady}, class: errdefs.Unavailable, code: api.CodeNoNodes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Pick(tt.nodes, Request{Tier: "function", CPU: 1, MemoryMB: 256, Prefer: tt.prefer, Avoid: tt.avoid}, now, time.Minute, tt.pending)
			if tt.class != "" {
				if errdefs.ClassOf(err) != tt.class || errdefs.CodeOf(err) != tt.code {
					t.Fatalf("Pick = %q, %v (%s); want %s %s", got, err, errdefs.CodeOf(err), tt.class, tt.code)
				}
				if tt.class == errdefs.Unavailable && errdefs.RetryAfterOf(err) <= 0 {
					t.Errorf("%s without a retry hint", tt.code)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Pick = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
