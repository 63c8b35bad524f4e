// Package trajectory keeps the durable log of rollouts over NATS
// JetStream: a trajectory's steps in order on one subject of a stream,
// its head (state, owner, counters) in a KV bucket, and large outputs and
// file contents in an object store. It stores and encodes; the control
// plane decides what to log and when (docs/design/trajectories.md).
package trajectory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/natsbus"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Stream, bucket and subject names.
const (
	StreamName    = "DSEC_TRAJECTORIES"
	SubjectPrefix = "dsec.traj." // + key(id): one subject per trajectory
	BucketHeads   = "dsec_trajectories"
)

// Defaults of Options.
const (
	DefaultRetention = 7 * 24 * time.Hour
	DefaultMaxBytes  = 1 << 30
	DefaultInlineMax = 16 << 10
	// flushEvery is how long a head's counters may lag its log.
	flushEvery = time.Second
)

// Options tune the store. Zero values are valid.
type Options struct {
	// Retention is how long steps, heads and blobs are kept after they
	// were last written. Default 7 days.
	Retention time.Duration
	// Replicas of the stream and buckets; 0 keeps what they have (1 when
	// new): see natsbus.Replicas.
	Replicas int
	// MaxBytes caps a trajectory: its steps' encoded sizes plus its
	// blobs. Default 1 GiB.
	MaxBytes int64
	// Logger receives the failures of background flushes.
	Logger *slog.Logger
}

// Head is a trajectory's head as stored: what the API shows, and the
// fields only the server sees.
type Head struct {
	api.Trajectory
	// Owner identifies the token that created it; one owner cannot read
	// another's.
	Owner string `json:"owner"`
	// IndexedAt is when the owner's index entry was last written (it
	// expires with the bucket's TTL, so it is written again while the
	// trajectory lives).
	IndexedAt time.Time `json:"indexed_at"`
}

// Store is the trajectory log. It is safe for concurrent use.
//
// Head.Steps and Head.Bytes are kept in memory as steps and blobs are
// written and flushed to the stored head lazily: at most once a second,
// on Flush and on Close. Head merges them, so this Store's callers always
// see them current; another process may see them up to a second behind,
// and after a crash the bytes of the last second of appends are not
// counted (the size cap is approximate by that much). Steps is always
// recovered exactly from the log.
type Store struct {
	js         jetstream.JetStream
	stream     jetstream.Stream
	heads      jetstream.KeyValue
	blobStream jetstream.Stream
	opt        Options
	log        *slog.Logger

	mu     sync.Mutex // guards following fields
	trajs  map[string]*traj
	swept  time.Time // the last evictLocked
	closed bool
}

// Open creates the stream and buckets if needed and returns the store.
// It is idempotent: another server, or this one after a restart, opens
// the same state.
func Open(ctx context.Context, js jetstream.JetStream, opt Options) (*Store, error) {
	if opt.Retention == 0 {
		opt.Retention = DefaultRetention
	}
	if opt.MaxBytes == 0 {
		opt.MaxBytes = DefaultMaxBytes
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{js: js, opt: opt, log: opt.Logger, trajs: map[string]*traj{}}
	var err error
	// Direct gets are off: they may be served by a replica that lags,
	// and Append's recovery must read what the leader holds.
	s.stream, err = natsbus.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:        StreamName,
		Description: "trajectory steps, one subject per trajectory",
		Subjects:    []string{SubjectPrefix + "*"},
		Storage:     jetstream.FileStorage,
		Replicas:    natsbus.Replicas(ctx, js, StreamName, opt.Replicas),
		MaxAge:      opt.Retention,
		Discard:     jetstream.DiscardOld,
	})
	if err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", StreamName, err)
	}
	s.heads, err = natsbus.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketHeads, Description: "trajectory heads and owners' indexes", History: 1,
		Storage: jetstream.FileStorage, Replicas: natsbus.Replicas(ctx, js, natsbus.KVStream(BucketHeads), opt.Replicas), TTL: opt.Retention,
	})
	if err != nil {
		return nil, fmt.Errorf("opening bucket %s: %w", BucketHeads, err)
	}
	s.blobStream, err = natsbus.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: StreamBlobs, Description: "trajectory outputs and file contents, in chunks",
		Subjects: []string{blobSubjectPrefix + ">"}, Storage: jetstream.FileStorage, Replicas: natsbus.Replicas(ctx, js, StreamBlobs, opt.Replicas),
		MaxAge: opt.Retention, Discard: jetstream.DiscardOld, AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", StreamBlobs, err)
	}
	return s, nil
}

// KV keys: a head under h.<key>, and an entry per owner, holding the ID,
// under o.<key(owner)>.<key> so that List reads one owner's entries only.
func headKey(id string) string         { return "h." + key(id) }
func ownerPrefix(owner string) string  { return "o." + key(owner) + "." }
func ownerKey(owner, id string) string { return ownerPrefix(owner) + key(id) }
func notFound(id string) error {
	return errdefs.New(errdefs.NotFound, api.CodeTrajectoryNotFound, "trajectory %q not found", id)
}
func changed(id, what string) error {
	return errdefs.New(errdefs.Conflict, api.CodeTrajectoryChanged, "trajectory %q %s", id, what)
}
func (s *Store) expiry(t time.Time) time.Time { return t.Add(s.opt.Retention) }

// Begin creates a trajectory's head; Conflict trajectory_exists if the ID
// is taken. Zero times and state are filled in.
func (s *Store) Begin(ctx context.Context, h Head) error {
	if err := ValidID(h.ID); err != nil {
		return err
	}
	now := time.Now().UTC()
	if h.CreatedAt.IsZero() {
		h.CreatedAt = now
	}
	if h.State == "" {
		h.State = api.TrajectoryRecording
	}
	h.UpdatedAt, h.ExpiresAt, h.IndexedAt = now, s.expiry(now), now
	b, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("encoding trajectory head: %w", err)
	}
	// The owner's index entry is written with the head, at once: List
	// reads the head of each entry and keeps only the owner's, so an entry
	// for a name that turns out taken is harmless, and is removed. Steps
	// an earlier trajectory of this name left on its subject (a retention
	// changed between) are found by the first append's expected sequence,
	// none, and purged then. A recorded create so waits for two round
	// trips here (the head, then its first step) instead of three.
	indexed := make(chan error, 1)
	go func() {
		_, err := s.heads.PutString(ctx, ownerKey(h.Owner, h.ID), h.ID)
		indexed <- err
	}()
	_, err = s.heads.Create(ctx, headKey(h.ID), b)
	ierr := <-indexed // bounded: one request within ctx
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			s.dropStrayIndex(ctx, h.Owner, h.ID)
			return errdefs.New(errdefs.Conflict, api.CodeTrajectoryExists, "trajectory %q already exists", h.ID)
		}
		return fmt.Errorf("writing trajectory head %s: %w", h.ID, err)
	}
	if ierr != nil {
		// A head without its index entry is half-made: it goes, so that
		// the Begin can be tried again.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.heads.Purge(dctx, headKey(h.ID)); err != nil {
			s.log.Warn("removing a half-made trajectory head", "trajectory", h.ID, "err", err)
		}
		return fmt.Errorf("indexing trajectory %s: %w", h.ID, ierr)
	}
	t := s.traj(h.ID)
	t.mu.Lock()
	t.reset()
	t.loaded, t.bytes, t.flushedBytes = true, h.Bytes, h.Bytes
	t.fresh = true
	t.mu.Unlock()
	return nil
}

// dropStrayIndex removes owner's index entry for trajectory id unless
// id's head is owner's (a Begin that lost the name wrote it).
func (s *Store) dropStrayIndex(ctx context.Context, owner, id string) {
	h, _, err := s.readHead(ctx, id)
	if err == nil && h.Owner == owner {
		return
	}
	if err := s.heads.Delete(context.WithoutCancel(ctx), ownerKey(owner, id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("removing a stray trajectory index entry", "trajectory", id, "err", err)
	}
}

// Head returns a trajectory's head and its revision (for UpdateHead);
// NotFound trajectory_not_found if there is none. Steps and Bytes include
// what this Store has not flushed yet.
func (s *Store) Head(ctx context.Context, id string) (Head, uint64, error) {
	h, rev, err := s.readHead(ctx, id)
	if err != nil {
		return h, 0, err
	}
	s.mergeCounters(&h)
	return h, rev, nil
}

func (s *Store) readHead(ctx context.Context, id string) (Head, uint64, error) {
	var h Head
	if err := ValidID(id); err != nil {
		return h, 0, err
	}
	e, err := s.heads.Get(ctx, headKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return h, 0, notFound(id)
	}
	if err != nil {
		return h, 0, fmt.Errorf("reading trajectory head %s: %w", id, err)
	}
	if err := json.Unmarshal(e.Value(), &h); err != nil {
		return h, 0, fmt.Errorf("decoding trajectory head %s: %w", id, err)
	}
	if h.ID != id { // a hash collision: not this trajectory
		return Head{}, 0, notFound(id)
	}
	return h, e.Revision(), nil
}

// UpdateHead replaces the head if it is still at revision rev (Conflict
// trajectory_changed otherwise: re-read and retry; the store's own lazy
// flush of the counters is one such writer). Steps and Bytes never go
// back: the larger of h's and the Store's own are written.
func (s *Store) UpdateHead(ctx context.Context, h Head, rev uint64) (uint64, error) {
	if err := ValidID(h.ID); err != nil {
		return 0, err
	}
	s.mergeCounters(&h)
	nrev, err := s.writeHead(ctx, h, rev)
	if err != nil {
		return nrev, err
	}
	s.flushed(h.ID, h.Steps, h.Bytes)
	return nrev, nil
}

// writeHead is UpdateHead with h's counters as they are.
func (s *Store) writeHead(ctx context.Context, h Head, rev uint64) (uint64, error) {
	now := time.Now().UTC()
	h.UpdatedAt, h.ExpiresAt = now, s.expiry(now)
	reindex := now.Sub(h.IndexedAt) > s.opt.Retention/2
	if reindex {
		h.IndexedAt = now
	}
	b, err := json.Marshal(h)
	if err != nil {
		return 0, fmt.Errorf("encoding trajectory head: %w", err)
	}
	nrev, err := s.heads.Update(ctx, headKey(h.ID), b, rev)
	if err != nil {
		if wrongSequence(err) {
			return 0, changed(h.ID, "changed concurrently")
		}
		return 0, fmt.Errorf("updating trajectory head %s: %w", h.ID, err)
	}
	if reindex {
		if _, err := s.heads.PutString(ctx, ownerKey(h.Owner, h.ID), h.ID); err != nil {
			return nrev, fmt.Errorf("indexing trajectory %s: %w", h.ID, err)
		}
	}
	return nrev, nil
}

// MutateHead applies fn to the current head and writes it, re-reading and
// retrying when another writer got there first. fn may run more than
// once; an error from it is returned as is.
func (s *Store) MutateHead(ctx context.Context, id string, fn func(*Head) error) (Head, error) {
	for attempt := 0; ; attempt++ {
		h, rev, err := s.Head(ctx, id)
		if err != nil {
			return h, err
		}
		if err := fn(&h); err != nil {
			return h, err
		}
		h.ID = id
		_, err = s.UpdateHead(ctx, h, rev)
		if err == nil || errdefs.CodeOf(err) != api.CodeTrajectoryChanged || attempt == 20 {
			return h, err
		}
	}
}
