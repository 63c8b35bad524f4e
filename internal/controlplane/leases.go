package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/store"
)

// Several API servers serve one DSec. Each holds a lease in the store
// (store.BucketLeases), renewed every LeaseTTL/5; the bucket's TTL drops
// a lease that is not renewed. Two uses:
//
//   - A pending sandbox's create belongs to the server that accepted it
//     (its record's Creator) while that server's lease lives. Once the
//     lease is gone, the leader completes the create (the node has the
//     sandbox) or fails it (finishOrphanedCreates).
//   - One server, the leader, does the work that must be done once for
//     the whole fleet: reconciling nodes, failing lost ones, draining,
//     expiring sandboxes, sweeping snapshots. Every server serves the
//     API and places creates.
//
// A leader that cannot renew stops acting as one after LeaseTTL/2, half
// the time before another may take over, so two never act at once (as
// long as their clocks run at about the same rate).

// leaseStore keeps the leases (*store.Store).
type leaseStore interface {
	PutLease(ctx context.Context, key string, l store.Lease, rev uint64) (uint64, error)
	DropLease(ctx context.Context, key string, rev uint64) error
	Leases(ctx context.Context) (map[string]store.LeaseEntry, error)
}

type leases struct {
	st          leaseStore // nil: this server is alone
	name        string
	incarnation string
	ttl         time.Duration

	mu sync.Mutex // guards following fields
	// seen: server run (name/incarnation) → when this process last saw
	// its lease; since: when
	// it first read the leases. A server is gone once its lease has not
	// been seen for a TTL (one read can miss a key: a replica that lags).
	seen        map[string]time.Time
	since       time.Time
	ownRev      uint64
	leaderRev   uint64
	leaderUntil time.Time
	// took is set when this server became the leader; the node loop
	// takes it (and looks at every node).
	took bool
}

func newLeases(st leaseStore, name string, ttl time.Duration) *leases {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &leases{st: st, name: name, incarnation: hex.EncodeToString(b), ttl: ttl, seen: map[string]time.Time{}, took: true}
}

// leading reports whether this server acts as the leader now.
func (l *leases) leading() bool {
	if l.st == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.leaderUntil)
}

// tookLead reports, once, that this server became the leader.
func (l *leases) tookLead() bool {
	if !l.leading() {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.took
	l.took = false
	return t
}

// creatorGone reports whether the server run that accepted a create
// (begun at began) has stopped: this server's earlier runs have;
// another's has once neither its lease nor the create has been seen for
// a TTL (a run that started after this one last read the leases is not
// in them yet). Alone, every other run is gone.
func (l *leases) creatorGone(creator, run string, began time.Time) bool {
	switch {
	case creator == l.name && run == l.incarnation:
		return false
	case creator == l.name, l.st == nil:
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since.IsZero() {
		return false
	}
	last, ok := l.seen[creator+"/"+run]
	if !ok {
		last = l.since
	}
	if began.After(last) {
		last = began
	}
	return time.Since(last) > l.ttl
}

// renew renews this server's lease and the leader's (or takes the
// leader's if it is free), and rereads who is alive.
func (l *leases) renew(ctx context.Context, log *slog.Logger) {
	now := time.Now()
	all, err := l.st.Leases(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("reading leases", "err", err)
		}
		return
	}
	me := store.Lease{Server: l.name, Incarnation: l.incarnation, At: now.UTC()}
	key := store.LeaseServerPrefix + l.name
	cur, held := all[key]
	l.mu.Lock()
	ownRev := l.ownRev
	l.mu.Unlock()
	if held && ownRev != 0 && cur.Incarnation != l.incarnation {
		log.Error("another process runs as this server: server names must be unique", "server", l.name)
	}
	rev, err := l.st.PutLease(ctx, key, me, cur.Rev)
	if err != nil && ctx.Err() == nil {
		log.Warn("renewing the server's lease", "err", err)
	}
	var live []string
	for k, e := range all {
		if strings.HasPrefix(k, store.LeaseServerPrefix) {
			live = append(live, e.Server+"/"+e.Incarnation)
		}
	}
	var leaderRev uint64
	lead, taken := all[store.LeaseLeader]
	switch {
	case !taken:
		leaderRev, err = l.st.PutLease(ctx, store.LeaseLeader, me, 0)
	case lead.Server == l.name:
		// Ours, or our previous run's: renewed (taken back at once).
		leaderRev, err = l.st.PutLease(ctx, store.LeaseLeader, me, lead.Rev)
	default:
		err = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range live {
		l.seen[s] = now
	}
	if l.since.IsZero() {
		l.since = now
	}
	l.ownRev = rev
	if leaderRev != 0 && err == nil {
		if !now.Before(l.leaderUntil) {
			l.took = true
			log.Info("leading the control plane", "server", l.name)
		}
		l.leaderRev, l.leaderUntil = leaderRev, now.Add(l.ttl/2)
	} else if now.Before(l.leaderUntil) && (taken && lead.Server != l.name) {
		// Another took it: stop at once.
		l.leaderUntil = time.Time{}
		log.Warn("no longer leading the control plane", "leader", lead.Server)
	}
}

// release gives the leases up (a clean stop): another server leads at
// once instead of after the TTL.
func (l *leases) release(ctx context.Context) {
	if l.st == nil {
		return
	}
	l.mu.Lock()
	ownRev, leaderRev, leading := l.ownRev, l.leaderRev, time.Now().Before(l.leaderUntil)
	l.leaderUntil = time.Time{}
	l.mu.Unlock()
	if leading && leaderRev != 0 {
		_ = l.st.DropLease(ctx, store.LeaseLeader, leaderRev)
	}
	if ownRev != 0 {
		_ = l.st.DropLease(ctx, store.LeaseServerPrefix+l.name, ownRev)
	}
}

// leaseLoop renews the leases every TTL/5 until ctx ends.
func (m *Manager) leaseLoop(ctx context.Context) {
	m.every(ctx, m.leases.ttl/5, func(ctx context.Context, _ time.Time) { m.leases.renew(ctx, m.log) })
}
