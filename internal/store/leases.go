package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// BucketLeases holds the API servers' leases: one key per live server
// ("server.<name>") and the leader's ("leader"). The bucket's TTL is the
// lease: a key not renewed within it disappears.
const BucketLeases = "dsec_leases"

// Lease keys.
const (
	LeaseLeader       = "leader"
	LeaseServerPrefix = "server."
)

// Lease is what a lease key holds: which server holds it, and which run
// of that server (a restarted server takes its own leases back; another
// process with the same name is told apart).
type Lease struct {
	Server      string    `json:"server"`
	Incarnation string    `json:"incarnation"`
	At          time.Time `json:"at"`
}

// LeaseEntry is a lease and its revision.
type LeaseEntry struct {
	Lease
	Rev uint64
}

// PutLease writes lease key: with rev 0 only if the key is absent (its
// TTL ran out, or it never was), else only if it is still at rev.
// Conflict if not.
func (s *Store) PutLease(ctx context.Context, key string, l Lease, rev uint64) (uint64, error) {
	b, err := json.Marshal(l)
	if err != nil {
		return 0, fmt.Errorf("encoding lease: %w", err)
	}
	if rev == 0 {
		nrev, err := s.leases.Create(ctx, key, b)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, errdefs.New(errdefs.Conflict, api.CodeRevisionMismatch, "lease %q is held", key)
		}
		if err != nil {
			return 0, fmt.Errorf("taking lease %s: %w", key, err)
		}
		return nrev, nil
	}
	return updateRaw(ctx, s.leases, key, "lease", b, rev)
}

// Leases returns every live lease by key.
func (s *Store) Leases(ctx context.Context) (map[string]LeaseEntry, error) {
	keys, err := s.leases.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing leases: %w", err)
	}
	out := map[string]LeaseEntry{}
	for k := range keys.Keys() {
		e, err := s.leases.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("reading lease %s: %w", k, err)
		}
		var l Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			continue
		}
		out[k] = LeaseEntry{Lease: l, Rev: e.Revision()}
	}
	return out, nil
}

// DropLease deletes lease key if it is still at rev (a server stopping
// cleanly hands its leases on at once).
func (s *Store) DropLease(ctx context.Context, key string, rev uint64) error {
	if err := s.leases.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("dropping lease %s: %w", key, err)
	}
	return nil
}
