// Package store keeps DSec's durable control-plane state in NATS JetStream:
// key/value buckets for sandboxes, nodes and images, and a stream of
// lifecycle events. Records are JSON. Updates are compare-and-set on the
// key's revision, so concurrent writers cannot lose each other's changes.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/dsec-dev/dsec/internal/natsbus"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Bucket and stream names.
const (
	BucketSandboxes = "dsec_sandboxes"
	BucketNodes     = "dsec_nodes"
	BucketImages    = "dsec_images"
	BucketLayers    = "dsec_layers"
	BucketSnapshots = "dsec_snapshots"
	StreamEvents    = "DSEC_EVENTS"
	// StreamAudit holds audit events (audit.Stream), under
	// AuditSubjectPrefix<sandbox>.
	StreamAudit        = "audit"
	AuditSubjectPrefix = "dsec.audit."
	// EventSubjectPrefix prefixes lifecycle event subjects:
	// dsec.events.sandbox.<id>.<state>.
	EventSubjectPrefix = "dsec.events."
)

// Options tune the store. Zero values are valid.
type Options struct {
	// Replicas for buckets and streams; 0 keeps what they have (1 when
	// new): see natsbus.Replicas.
	Replicas int
	// NodeTTL ages out node records that stop heartbeating. Default 60s.
	NodeTTL time.Duration
	// EventMaxAge bounds how long lifecycle events are kept. Default 7 days.
	EventMaxAge time.Duration
	// LeaseTTL is how long a server's lease lasts unrenewed. Default 10s.
	LeaseTTL time.Duration
}

// Store is the JetStream-backed state. It is safe for concurrent use.
type Store struct {
	js        jetstream.JetStream
	sandboxes jetstream.KeyValue
	nodes     jetstream.KeyValue
	imageKV   jetstream.KeyValue
	layerKV   jetstream.KeyValue
	snapKV    jetstream.KeyValue
	requests  jetstream.KeyValue
	nodeAdmin jetstream.KeyValue
	leases    jetstream.KeyValue

	own ownWrites // sandbox records being written by this Store's callers
}

// Open creates the buckets and stream if needed and returns the store.
func Open(ctx context.Context, nc *nats.Conn, opt Options) (*Store, error) {
	if opt.NodeTTL == 0 {
		opt.NodeTTL = time.Minute
	}
	if opt.LeaseTTL == 0 {
		opt.LeaseTTL = 10 * time.Second
	}
	if opt.EventMaxAge == 0 {
		opt.EventMaxAge = 7 * 24 * time.Hour
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("opening JetStream: %w", err)
	}
	s := &Store{js: js}
	buckets := []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&s.sandboxes, jetstream.KeyValueConfig{Bucket: BucketSandboxes, History: 1, Storage: jetstream.FileStorage,
			Description: "sandbox records"}},
		{&s.nodes, jetstream.KeyValueConfig{Bucket: BucketNodes, History: 1, Storage: jetstream.FileStorage,
			TTL: opt.NodeTTL, Description: "node heartbeats"}},
		{&s.imageKV, jetstream.KeyValueConfig{Bucket: BucketImages, History: 1, Storage: jetstream.FileStorage,
			Description: "images by ID and name"}},
		{&s.layerKV, jetstream.KeyValueConfig{Bucket: BucketLayers, History: 1, Storage: jetstream.FileStorage,
			Description: "layers by ID and name"}},
		{&s.snapKV, jetstream.KeyValueConfig{Bucket: BucketSnapshots, History: 1, Storage: jetstream.FileStorage,
			Description: "snapshots of sandboxes, with their owners"}},
		{&s.requests, jetstream.KeyValueConfig{Bucket: BucketRequests, History: 1, Storage: jetstream.FileStorage,
			TTL: 24 * time.Hour, Description: "idempotent creates' keys and their sandboxes"}},
		{&s.nodeAdmin, jetstream.KeyValueConfig{Bucket: BucketNodeAdmin, History: 1, Storage: jetstream.FileStorage,
			Description: "what operators set on nodes: cordon, drain"}},
		{&s.leases, jetstream.KeyValueConfig{Bucket: BucketLeases, History: 1, Storage: jetstream.FileStorage,
			TTL: opt.LeaseTTL, Description: "API servers' leases: live servers and the leader"}},
	}
	// In a cluster each bucket and stream is a replicated group that
	// elects its leader before the create answers: made at once, their
	// elections overlap instead of adding up.
	var g errgroup.Group
	for _, b := range buckets {
		g.Go(func() error {
			b.cfg.Replicas = natsbus.Replicas(ctx, js, natsbus.KVStream(b.cfg.Bucket), opt.Replicas)
			kv, err := natsbus.EnsureKV(ctx, js, b.cfg)
			if err != nil {
				return fmt.Errorf("opening bucket %s: %w", b.cfg.Bucket, err)
			}
			*b.kv = kv
			return nil
		})
	}
	streams := []jetstream.StreamConfig{{
		Name:        StreamEvents,
		Description: "sandbox lifecycle events",
		Subjects:    []string{EventSubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		MaxAge:      opt.EventMaxAge,
		MaxMsgs:     10_000_000,
		Discard:     jetstream.DiscardOld,
	}, {
		// What the nodes' monitors saw in sandboxes (internal/audit): one
		// subject per sandbox, kept as long as lifecycle events.
		Name:        StreamAudit,
		Description: "audit events of sandboxes",
		Subjects:    []string{AuditSubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		MaxAge:      opt.EventMaxAge,
		MaxMsgs:     50_000_000,
		Discard:     jetstream.DiscardOld,
	}}
	for _, cfg := range streams {
		g.Go(func() error {
			cfg.Replicas = natsbus.Replicas(ctx, js, cfg.Name, opt.Replicas)
			if _, err := natsbus.EnsureStream(ctx, js, cfg); err != nil {
				return fmt.Errorf("opening stream %s: %w", cfg.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return s, nil
}

// AuditEvents returns up to limit of sandbox id's audit events, oldest
// first, starting after the first skip.
func (s *Store) AuditEvents(ctx context.Context, id string, skip, limit int) ([]api.AuditEvent, error) {
	subject := AuditSubjectPrefix + id
	stream, err := s.js.Stream(ctx, StreamAudit)
	if err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", StreamAudit, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", StreamAudit, err)
	}
	n := int(info.State.Subjects[subject]) - skip
	if n <= 0 {
		return []api.AuditEvent{}, nil
	}
	n = min(n, limit)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", StreamAudit, err)
	}
	out := make([]api.AuditEvent, 0, n)
	seen := 0
	for seen < skip+n {
		batch, err := cons.Fetch(min(skip+n-seen, 1000), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("reading stream %s: %w", StreamAudit, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			seen++
			if seen <= skip {
				continue
			}
			var e api.AuditEvent
			if err := json.Unmarshal(m.Data(), &e); err == nil {
				out = append(out, e)
			}
		}
		if err := batch.Error(); err != nil && got == 0 {
			return nil, fmt.Errorf("reading stream %s: %w", StreamAudit, err)
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}

// JetStream returns the JetStream context, for tests and tools.
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// The codes of a missing record and of one that exists already, by the
// noun of its messages. A name record is looked up for its layer or
// image, and reported as one.
var (
	notFoundCodes = map[string]string{"sandbox": api.CodeSandboxNotFound,
		"image": api.CodeImageNotFound, "image name": api.CodeImageNotFound,
		"layer": api.CodeLayerNotFound, "layer name": api.CodeLayerNotFound}
	existsCodes = map[string]string{"sandbox": api.CodeSandboxExists, "image": api.CodeImageExists, "layer": api.CodeLayerExists}
)

func get[T any](ctx context.Context, kv jetstream.KeyValue, key, what string) (T, uint64, error) {
	var v T
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return v, 0, errdefs.New(errdefs.NotFound, notFoundCodes[what], "%s %q not found", what, key)
	}
	if errors.Is(err, jetstream.ErrInvalidKey) {
		return v, 0, errdefs.New(errdefs.NotFound, notFoundCodes[what], "%s %q not found", what, key)
	}
	if err != nil {
		return v, 0, storeErr(ctx, err, "reading %s %s", what, key)
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return v, 0, fmt.Errorf("decoding %s %s: %w", what, key, err)
	}
	return v, e.Revision(), nil
}

// create stores v under key if the key is new; Conflict otherwise.
func create(ctx context.Context, kv jetstream.KeyValue, key, what string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s: %w", what, err)
	}
	return createRaw(ctx, kv, key, what, b)
}

func createRaw(ctx context.Context, kv jetstream.KeyValue, key, what string, b []byte) (uint64, error) {
	rev, err := kv.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errdefs.New(errdefs.Conflict, existsCodes[what], "%s %q already exists", what, key)
	}
	if err != nil {
		return 0, storeErr(ctx, err, "writing %s %s", what, key)
	}
	return rev, nil
}

// update stores v under key if its revision is still rev; Conflict
// otherwise (someone else wrote it first: re-read and retry).
func update(ctx context.Context, kv jetstream.KeyValue, key, what string, v any, rev uint64) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s: %w", what, err)
	}
	return updateRaw(ctx, kv, key, what, b, rev)
}

func updateRaw(ctx context.Context, kv jetstream.KeyValue, key, what string, b []byte, rev uint64) (uint64, error) {
	nrev, err := kv.Update(ctx, key, b, rev)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return 0, errdefs.Wrap(errdefs.Conflict, api.CodeRevisionMismatch, err, "%s %q changed concurrently", what, key)
		}
		return 0, storeErr(ctx, err, "updating %s %s", what, key)
	}
	return nrev, nil
}

func put(ctx context.Context, kv jetstream.KeyValue, key, what string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s: %w", what, err)
	}
	rev, err := kv.Put(ctx, key, b)
	if err != nil {
		return 0, storeErr(ctx, err, "writing %s %s", what, key)
	}
	return rev, nil
}

func list[T any](ctx context.Context, kv jetstream.KeyValue, what string) ([]T, error) {
	lister, err := kv.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %ss: %w", what, err)
	}
	defer lister.Stop()
	var out []T
	for key := range lister.Keys() {
		v, _, err := get[T](ctx, kv, key, what)
		if errors.Is(err, errdefs.NotFound) {
			continue // deleted between listing and reading
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// jsonCanonical encodes v as JSON; struct fields keep their declared order
// and map keys are sorted, so equal values encode equally.
func jsonCanonical(v any) ([]byte, error) { return json.Marshal(v) }

// storeErr wraps err of an operation on the store. When JetStream does
// not answer (a cluster without a quorum, a lost connection) and the
// caller's context is still live, the error is Unavailable with a retry
// hint: the request may succeed on a retry, here or on another server.
func storeErr(ctx context.Context, err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if ctx.Err() == nil && natsbus.Unreachable(err) {
		e := errdefs.Wrap(errdefs.Unavailable, api.CodeStoreUnavailable, err,
			"%s: the control plane's store does not answer (NATS JetStream without a quorum or unreachable); retry", msg)
		e.RetryAfter = time.Second
		return e
	}
	return fmt.Errorf("%s: %w", msg, err)
}
