package network

import (
	"context"
	"sync"
)

// Shared is one runtime's view of a Manager that several runtimes give
// their sandboxes networks from (the container and microvm tiers): every
// method is the Manager's but Recover. It is safe for concurrent use.
type Shared struct {
	*Manager
	g *shareGroup
	// once makes a second Recover of the same view a no-op.
	once sync.Once
}

type shareGroup struct {
	mu   sync.Mutex // guards following fields
	left int        // views that have not recovered yet
	live []string
}

// Share returns n views of m, one per runtime sharing it. Manager.Recover
// removes every network not in its list, so a runtime calling it alone
// would remove the other runtimes' networks: a view's Recover records its
// runtime's live sandboxes, and the last of the n views to recover calls
// m.Recover with all of them (and returns its error; the others return
// nil). A runtime that never recovers leaves the sweep undone, not the
// others' networks removed.
func (m *Manager) Share(n int) []*Shared {
	g := &shareGroup{left: n}
	out := make([]*Shared, n)
	for i := range out {
		out[i] = &Shared{Manager: m, g: g}
	}
	return out
}

// Recover records live as this view's sandboxes; the last view to
// recover calls Manager.Recover with every view's.
func (s *Shared) Recover(ctx context.Context, live []string) error {
	last := false
	var all []string
	s.once.Do(func() {
		s.g.mu.Lock()
		defer s.g.mu.Unlock()
		s.g.live = append(s.g.live, live...)
		s.g.left--
		last, all = s.g.left == 0, s.g.live
	})
	if !last {
		return nil
	}
	return s.Manager.Recover(ctx, all)
}
