package controlplane

import (
	"sync"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
)

// cache mirrors the sandbox records in memory so that reads (get, list,
// every exec's routing) never touch the store. It is fed by the manager's
// own writes and by the store's watch; a change only applies if its
// revision is newer than what the cache holds, so the two feeds can race.
type cache struct {
	mu   sync.RWMutex // guards following fields
	recs map[string]*cached
	live map[string]int    // owner → live sandboxes
	byTS map[[2]string]int // (tier, state) → count
}

type cached struct {
	rec store.SandboxRecord
	rev uint64
}

func newCache() *cache {
	return &cache{recs: map[string]*cached{}, live: map[string]int{}, byTS: map[[2]string]int{}}
}

// apply stores rec at rev unless the cache already holds a newer revision.
func (c *cache) apply(rec store.SandboxRecord, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.recs[rec.ID]
	if ok {
		if old.rev >= rev {
			return
		}
		c.accountLocked(old.rec, -1)
	}
	c.recs[rec.ID] = &cached{rec: rec, rev: rev}
	c.accountLocked(rec, +1)
}

// has reports whether the cache holds id at revision rev or later.
func (c *cache) has(id string, rev uint64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.recs[id]
	return ok && e.rev >= rev
}

// remove forgets a purged record.
func (c *cache) remove(id string, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.recs[id]; ok && old.rev < rev {
		c.accountLocked(old.rec, -1)
		delete(c.recs, id)
	}
}

// Preconditions: c.mu must be held.
func (c *cache) accountLocked(rec store.SandboxRecord, d int) {
	if sandbox.Live(rec.State) {
		c.live[rec.Owner] += d
		if c.live[rec.Owner] == 0 {
			delete(c.live, rec.Owner)
		}
	}
	k := [2]string{rec.Tier, string(rec.State)}
	c.byTS[k] += d
	if c.byTS[k] == 0 {
		delete(c.byTS, k)
	}
}

// get returns a copy of the record and its revision.
func (c *cache) get(id string) (store.SandboxRecord, uint64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.recs[id]
	if !ok {
		return store.SandboxRecord{}, 0, false
	}
	return e.rec, e.rev, true
}

// liveCount returns the owner's live sandboxes.
func (c *cache) liveCount(owner string) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.live[owner]
}

// each calls fn for every record under the read lock; fn must not call
// back into the cache.
func (c *cache) each(fn func(rec *store.SandboxRecord)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, e := range c.recs {
		fn(&e.rec)
	}
}

func (c *cache) counts() map[[2]string]int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[[2]string]int, len(c.byTS))
	for k, v := range c.byTS {
		out[k] = v
	}
	return out
}
