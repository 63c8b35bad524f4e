package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
)

// SandboxRecord is the durable record of a sandbox.
type SandboxRecord struct {
	api.Sandbox
	// Owner identifies the token that created the sandbox.
	Owner string `json:"owner"`
	// Env is kept so a node can recreate what it lost; never returned by
	// the API.
	Env map[string]string `json:"env,omitempty"`
	// ImageSource tells the node how to materialise the image: "layers"
	// or a development directory.
	ImageSource string `json:"image_source,omitempty"`
	// Layers are the image's layer IDs, bottom first (for in-use checks).
	Layers []string `json:"layers,omitempty"`
	// StateSince is when the sandbox entered its state.
	StateSince time.Time `json:"state_since"`
	// Creator is the API server that accepted the create: while the
	// sandbox is pending, its create is that server's, for as long as
	// the server holds its lease (controlplane/leases.go).
	Creator string `json:"creator,omitempty"`
	// CreatorRun is which run of that server (its lease's incarnation):
	// a restarted server has lost its predecessor's creates.
	CreatorRun string `json:"creator_run,omitempty"`
	// PhaseHistory lists the phases the sandbox entered, in order.
	PhaseHistory []api.PhaseChange `json:"phase_history,omitempty"`
	// Grades are the sealed gradings run for the sandbox, oldest first
	// (the last maxGrades).
	Grades []api.GradeSummary `json:"grades,omitempty"`
	// SecretEnv names the Env keys a trajectory never logs.
	SecretEnv []string `json:"secret_env,omitempty"`
	// ResumeOnPreempt: resume from the trajectory when the node is lost.
	ResumeOnPreempt bool `json:"resume_on_preempt,omitempty"`
	// FromSnapshot is the snapshot the sandbox started from.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// StateLayers are the layers snapshots added to its image, bottom
	// first: the next snapshot stacks its own on them.
	StateLayers []string `json:"state_layers,omitempty"`
	// BaseState are the state layers of the image it was created from.
	BaseState []string `json:"base_state,omitempty"`
	// StateImage is the image of its last snapshot.
	StateImage string `json:"state_image,omitempty"`
}

// GetSandbox returns the record and its revision; NotFound if absent.
func (s *Store) GetSandbox(ctx context.Context, id string) (SandboxRecord, uint64, error) {
	return get[SandboxRecord](ctx, s.sandboxes, id, "sandbox")
}

// CreateSandbox stores a new record; Conflict if the ID is taken.
//
// The caller applies the record to its own view on success: the watch
// skips it (see WatchSandboxes).
func (s *Store) CreateSandbox(ctx context.Context, r SandboxRecord) (uint64, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encoding sandbox: %w", err)
	}
	done := s.own.begin(r.ID, b)
	defer done()
	return createRaw(ctx, s.sandboxes, r.ID, "sandbox", b)
}

// UpdateSandbox replaces the record if it is still at revision rev.
// As with CreateSandbox, the caller applies it on success.
func (s *Store) UpdateSandbox(ctx context.Context, r SandboxRecord, rev uint64) (uint64, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encoding sandbox: %w", err)
	}
	done := s.own.begin(r.ID, b)
	defer done()
	return updateRaw(ctx, s.sandboxes, r.ID, "sandbox", b, rev)
}

// PurgeSandbox removes a record for good.
func (s *Store) PurgeSandbox(ctx context.Context, id string) error {
	if err := s.sandboxes.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return storeErr(ctx, err, "purging sandbox %s", id)
	}
	return nil
}

// SandboxChange is one update seen by WatchSandboxes. Deleted is set when
// the record was purged (Record then only has its ID).
type SandboxChange struct {
	Record   SandboxRecord
	Revision uint64
	Deleted  bool
}

// WatchSandboxes delivers every current record, then nil (the end of the
// initial values), then later changes in revision order, until ctx ends.
// fn runs on one goroutine, in order. Each key's changes end with its
// latest state, but a state replaced soon after it was written may be
// skipped (seen under load: a create's pending record, replaced by its
// running one): consumers must be level-triggered, as the control
// plane's cache is (it applies records by revision).
//
// The changes this Store's own CreateSandbox and UpdateSandbox calls
// make are skipped without being decoded, their callers applying them:
// while the call runs, by its value (the watch may deliver it before the
// write's acknowledgement), and afterwards through known, which says
// that the consumer already holds a record at revision rev or later. A
// writer's own changes are most of them; decoding them was a twentieth of
// a create's CPU.
func (s *Store) WatchSandboxes(ctx context.Context, log *slog.Logger, known func(id string, rev uint64) bool, fn func(*SandboxChange)) error {
	w, err := s.sandboxes.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watching sandboxes: %w", err)
	}
	go func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					initial = false
					fn(nil)
					continue
				}
				ch := &SandboxChange{Revision: e.Revision()}
				if e.Operation() == jetstream.KeyValuePut && !initial &&
					(s.own.writing(e.Key(), e.Value()) || known != nil && known(e.Key(), e.Revision())) {
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					if initial {
						continue // purged before we looked: nothing to forget
					}
					ch.Deleted = true
					ch.Record.ID = e.Key()
				} else if err := json.Unmarshal(e.Value(), &ch.Record); err != nil {
					log.Warn("skipping undecodable sandbox record", "key", e.Key(), "err", err)
					continue
				}
				fn(ch)
			}
		}
	}()
	return nil
}

// Event is a lifecycle event.
type Event struct {
	Sandbox string    `json:"sandbox"`
	Tier    string    `json:"tier"`
	Node    string    `json:"node,omitempty"`
	From    api.State `json:"from,omitempty"`
	State   api.State `json:"state"`
	Reason  string    `json:"reason,omitempty"`
	Time    time.Time `json:"time"`
}

// Subject is where the event is published.
func (e Event) Subject() string {
	return EventSubjectPrefix + "sandbox." + e.Sandbox + "." + string(e.State)
}

// PublishEvent appends a lifecycle event to the events stream without
// waiting for the acknowledgement: events are a record of what happened,
// and the sandbox record, written synchronously, is the source of truth.
func (s *Store) PublishEvent(ctx context.Context, e Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encoding event: %w", err)
	}
	// An async publish on a closed connection leaves a goroutine of the
	// client library waiting forever (its status channel is nil then).
	if s.js.Conn().IsClosed() {
		return fmt.Errorf("publishing event: %w", nats.ErrConnectionClosed)
	}
	if _, err := s.js.PublishAsync(e.Subject(), b); err != nil {
		return fmt.Errorf("publishing event: %w", err)
	}
	return nil
}

// FlushEvents waits until published events are acknowledged or ctx ends.
func (s *Store) FlushEvents(ctx context.Context) error {
	select {
	case <-s.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ownWrites holds the sandbox records this Store is writing, by key.
// Safe for concurrent use.
type ownWrites struct {
	mu sync.Mutex // guards m
	m  map[string][]byte
}

// begin registers value b being written under key; done ends it.
func (o *ownWrites) begin(key string, b []byte) (done func()) {
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string][]byte{}
	}
	o.m[key] = b
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		if cur, ok := o.m[key]; ok && &cur[0] == &b[0] {
			delete(o.m, key)
		}
		o.mu.Unlock()
	}
}

// writing reports whether value b is being written under key.
func (o *ownWrites) writing(key string, b []byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	cur, ok := o.m[key]
	return ok && bytes.Equal(cur, b)
}
