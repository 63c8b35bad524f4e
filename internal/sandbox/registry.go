package sandbox

import (
	"fmt"
	"slices"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Registry maps tier names to runtimes. It is safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex // guards following fields
	runtimes map[string]Runtime
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{runtimes: map[string]Runtime{}}
}

// Register adds rt under its tier name. Registering a tier twice is an error.
func (r *Registry) Register(rt Runtime) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.runtimes[rt.Tier()]; dup {
		return fmt.Errorf("tier %q registered twice", rt.Tier())
	}
	r.runtimes[rt.Tier()] = rt
	return nil
}

// Lookup returns the runtime for tier. It returns an error of class
// Invalid for a tier DSec does not define and Unsupported for a defined tier
// this node does not run.
func (r *Registry) Lookup(tier string) (Runtime, error) {
	r.mu.RLock()
	rt, ok := r.runtimes[tier]
	r.mu.RUnlock()
	if ok {
		return rt, nil
	}
	if !KnownTier(tier) {
		return nil, errdefs.New(errdefs.Invalid, api.CodeUnknownTier, "unknown tier %q (tiers: function, container, microvm, vm)", tier)
	}
	return nil, errdefs.New(errdefs.Unsupported, api.CodeTierUnavailable, "tier %q is not available on this node", tier)
}

// All returns the registered runtimes ordered by tier name.
func (r *Registry) All() []Runtime {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Runtime, 0, len(r.runtimes))
	for _, rt := range r.runtimes {
		out = append(out, rt)
	}
	slices.SortFunc(out, func(a, b Runtime) int { return tierOrder(a.Tier()) - tierOrder(b.Tier()) })
	return out
}
