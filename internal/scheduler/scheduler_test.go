package scheduler

import (
	"errors"
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
	tests := []struct {
		name    string
		nodes   []api.Node
		pending map[string]int
		want    string
		class   errdefs.Class
	}{
		{name: "most free slots", nodes: []api.Node{node("a", fn, 10, 8, 0, now), node("b", fn, 10, 2, 0, now)}, want: "b"},
		{name: "pending counts", nodes: []api.Node{node("a", fn, 10, 2, 0, now), node("b", fn, 10, 1, 0, now)}, pending: map[string]int{"b": 5}, want: "a"},
		{name: "tie by load", nodes: []api.Node{node("a", fn, 10, 0, 1.5, now), node("b", fn, 10, 0, 0.5, now)}, want: "b"},
		{name: "stale skipped", nodes: []api.Node{node("a", fn, 10, 0, 0, now.Add(-time.Hour)), node("b", fn, 10, 9, 0, now)}, want: "b"},
		{name: "wrong tier", nodes: []api.Node{node("a", []string{"container"}, 10, 0, 0, now)}, class: errdefs.Unsupported},
		{name: "full", nodes: []api.Node{node("a", fn, 2, 2, 0, now)}, class: errdefs.Unavailable},
		{name: "none", class: errdefs.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Pick(tt.nodes, Request{Tier: "function"}, now, time.Minute, tt.pending)
			if tt.class != "" {
				if !errors.Is(err, tt.class) {
					t.Fatalf("Pick = %q, %v; want class %s", got, err, tt.class)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Pick = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
