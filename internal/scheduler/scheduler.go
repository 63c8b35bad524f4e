// Package scheduler places sandboxes on nodes. Today it spreads load over
// the nodes that run the requested tier; measured-usage packing,
// overcommit and cloud bursting grow here.
package scheduler

import (
	"slices"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Request is what a placement needs to know.
type Request struct {
	Tier     string
	CPU      float64
	MemoryMB int
	// Prefer names a node to use if it can take the sandbox (siblings of
	// a fork share their snapshot's pages there).
	Prefer string
	// Avoid names a node not to use (a preempted sandbox's).
	Avoid string
}

// Pick chooses a node for req among nodes, preferring the one with the
// most free sandbox slots; ties go to the lowest load. Nodes not seen
// within stale are skipped. Pending counts placements made but not yet
// visible in the nodes' heartbeats. A node req prefers wins if it has a
// free slot; a node it avoids, or a cordoned one, is never chosen.
func Pick(nodes []api.Node, req Request, now time.Time, stale time.Duration, pending map[string]int) (string, error) {
	best, bestFree := "", -1
	var bestLoad float64
	tierSeen, connected := false, false
	for _, n := range nodes {
		if !n.Ready || now.Sub(n.LastSeen) > stale {
			continue
		}
		connected = true
		if !slices.ContainsFunc(n.Tiers, func(t api.TierInfo) bool { return t.Name == req.Tier && t.Available }) {
			continue
		}
		tierSeen = true
		if n.Cordoned || n.Draining { // an operator's: as good as full
			continue
		}
		free := n.Capacity.MaxSandboxes - n.Usage.Sandboxes - pending[n.ID]
		if free <= 0 || n.ID == req.Avoid {
			continue
		}
		if n.ID == req.Prefer {
			return n.ID, nil
		}
		if free > bestFree || (free == bestFree && n.Usage.Load1 < bestLoad) {
			best, bestFree, bestLoad = n.ID, free, n.Usage.Load1
		}
	}
	switch {
	case best != "":
		return best, nil
	case tierSeen:
		return "", &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeCapacityExhausted,
			Msg: "every node that runs the " + req.Tier + " tier is full", RetryAfter: time.Second}
	case !connected:
		// Listed nodes that stopped heartbeating are not connected: a
		// node restarting is a wait, not a tier this cluster lacks.
		return "", &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeNoNodes,
			Msg: "no node is connected", RetryAfter: time.Second}
	}
	return "", errdefs.New(errdefs.Unsupported, api.CodeTierUnavailable, "no connected node runs the %s tier", req.Tier)
}
