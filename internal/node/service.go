// Package node is the node service: it owns the tier runtimes of one host,
// the sandboxes they run, and serves the noderpc protocol over NATS for
// the control plane. It also heartbeats the node's tiers, capacity and
// usage so that the scheduler can place sandboxes.
package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Options configure an agent. Zero values are valid except ID and Registry.
type Options struct {
	ID       string
	Registry *sandbox.Registry
	Logger   *slog.Logger
	Version  string
	// StateDir keeps which image each sandbox holds across agent
	// restarts. Required with Layers.
	StateDir string
	// Layers is the node's layer cache; without it only directory images
	// run.
	Layers layerViews
	// MaxSandboxes caps live sandboxes on this node. Default 10000.
	MaxSandboxes int
	// Heartbeat is the heartbeat interval. Default 2 s.
	Heartbeat time.Duration
	// MaxConcurrent caps requests handled at once. Default 4096.
	MaxConcurrent int
	// Starts bounds each tier's creates in flight on this node and those
	// waiting for their turn (admission.go); zero fields take each tier's
	// defaults.
	Starts StartLimits
	// Monitor and Guard are the states of the node's eBPF monitor and
	// cgroup-bpf guard, for its status.
	Monitor, Guard string
	// Steps, if set, is told each sandbox's trajectory steps as they
	// begin, to tag audit events with them (the audit recorder).
	Steps StepLabeler
	// Blobs is the blob store layers are fetched from, where snapshots
	// store theirs; without it snapshots are refused.
	Blobs blobPutter
	// SnapshotDir holds snapshots' scratch files (a copy of the state and
	// the layer built from it); default <StateDir>/../snapshots, else the
	// system's temporary directory.
	SnapshotDir string
}

// StepLabeler labels a sandbox's audit events with the trajectory step
// current at their time.
type StepLabeler interface {
	SetStep(id string, step int, at time.Time)
	ForgetSteps(id string)
}

// heartbeatSink is where heartbeats go (the store's node bucket).
type heartbeatSink interface {
	PutNode(ctx context.Context, n api.Node) error
	DeleteNode(ctx context.Context, id string) error
}

// Service runs the sandboxes of one node. It is safe for concurrent use.
type Service struct {
	opt     Options
	log     *slog.Logger
	started time.Time // reported in heartbeats

	mu        sync.Mutex // guards following fields
	sandboxes map[string]*entry
	calls     map[string]context.CancelFunc
	reads     map[string]*readSession
	writes    map[string]*writeSession

	// ended: see ended.go. recovering is set while recover runs;
	// early holds the ends reported meanwhile for sandboxes not yet in
	// sandboxes; stopped is set once Stop began.
	recovering, stopped bool
	early               map[string]bool

	state *stateDir
	refs  imageRefs // see imagerefs.go

	gmu   sync.Mutex       // guards following field
	gates map[string]*gate // admission of creates, by tier

	smu    sync.Mutex            // guards following fields
	snaps  map[string]*snapState // each sandbox's last snapshot (snapshot.go)
	stores map[string]*storeJob  // Background snapshots' uploads, by layer ID

	sem     chan struct{}
	warming chan struct{}  // the warms running (images.go)
	wg      sync.WaitGroup // request handlers and background loops
	// dmu orders dispatch's wg.Add before Stop's wg.Wait: a message
	// already taken by the NATS client is delivered after Unsubscribe.
	dmu      sync.Mutex // guards following field
	stopping bool
	bg       context.Context
	cancel   context.CancelFunc
	sub      *nats.Subscription
	nc       *nats.Conn
}

// entry is a sandbox slot. sb is nil while the sandbox is being created.
type entry struct {
	tier string
	sb   sandbox.Sandbox
	// release frees the sandbox's image view once it is destroyed.
	release func()
	// ended is set if the sandbox ended by itself while being created.
	ended *sandbox.Ended
}

// New returns an agent; Start brings it up.
func New(opt Options) (*Service, error) {
	if !noderpc.ValidNodeID(opt.ID) {
		return nil, fmt.Errorf("node ID %q: use 1–64 letters, digits, '-' or '_'", opt.ID)
	}
	if opt.Registry == nil {
		return nil, fmt.Errorf("node %s: no runtimes", opt.ID)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.MaxSandboxes == 0 {
		opt.MaxSandboxes = 10000
	}
	if opt.Heartbeat == 0 {
		opt.Heartbeat = 2 * time.Second
	}
	if opt.MaxConcurrent == 0 {
		opt.MaxConcurrent = 4096
	}
	return &Service{
		started:   time.Now().UTC().Truncate(time.Millisecond),
		opt:       opt,
		log:       opt.Logger.With("node", opt.ID),
		sandboxes: map[string]*entry{},
		calls:     map[string]context.CancelFunc{},
		reads:     map[string]*readSession{},
		writes:    map[string]*writeSession{},
		gates:     map[string]*gate{},
		sem:       make(chan struct{}, opt.MaxConcurrent),
		warming:   make(chan struct{}, maxWarming),
	}, nil
}

// ID is the node's ID.
func (a *Service) ID() string { return a.opt.ID }

// Start re-adopts the sandboxes the runtimes recover, then serves requests
// on nc and heartbeats to hb until Stop.
func (a *Service) Start(ctx context.Context, nc *nats.Conn, hb heartbeatSink) error {
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.bg, a.cancel, a.nc = bg, cancel, nc
	if err := a.recover(ctx); err != nil {
		cancel()
		// The state tmpfs recover mounted would outlive the failed start
		// (Stop is not called): unmount it if it is empty.
		if a.state != nil {
			if cerr := a.state.close(); cerr != nil {
				a.log.Warn("closing node state", "err", cerr)
			}
		}
		return err
	}
	sub, err := nc.Subscribe(noderpc.SubjectAll(a.opt.ID), func(m *nats.Msg) { a.dispatch(bg, m) })
	if err != nil {
		cancel()
		return fmt.Errorf("subscribing node %s: %w", a.opt.ID, err)
	}
	// Requests come in bursts of small messages; don't drop them.
	_ = sub.SetPendingLimits(-1, -1)
	a.sub = sub
	if err := nc.Flush(); err != nil {
		cancel()
		return fmt.Errorf("subscribing node %s: %w", a.opt.ID, err)
	}
	a.heartbeat(ctx, hb)
	a.wg.Add(2)
	go a.heartbeatLoop(bg, hb)
	go a.janitor(bg)
	return nil
}

// Stop stops serving and heartbeating. Sandboxes keep running; call
// DestroyAll first to remove them.
func (a *Service) Stop(ctx context.Context, hb heartbeatSink) {
	if a.sub != nil {
		_ = a.sub.Unsubscribe()
	}
	a.stopEnds()
	if a.cancel != nil {
		a.cancel()
	}
	a.dmu.Lock()
	a.stopping = true
	a.dmu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	for _, r := range a.reads {
		r.f.Close()
	}
	for _, w := range a.writes {
		w.abort()
	}
	clear(a.reads)
	clear(a.writes)
	a.mu.Unlock()
	if a.state != nil {
		if err := a.state.close(); err != nil {
			a.log.Warn("closing node state", "err", err)
		}
	}
	if hb != nil {
		if err := hb.DeleteNode(ctx, a.opt.ID); err != nil {
			a.log.Warn("removing node record", "err", err)
		}
	}
}

// Create creates a sandbox, once the tier's admission lets it start. An
// error of class RateLimited or Unavailable means nothing of it is left
// on the node: the caller may retry.
func (a *Service) Create(ctx context.Context, req noderpc.CreateRequest) error {
	return a.createEncoded(ctx, req, nil)
}

// createEncoded is Create, given the image reference's encoding if the
// request brought one (it goes to the state file as it is).
func (a *Service) createEncoded(ctx context.Context, req noderpc.CreateRequest, image json.RawMessage) error {
	rt, err := a.opt.Registry.Lookup(req.Tier)
	if err != nil {
		return err
	}
	a.warm(req.Image)
	leave, err := a.gateFor(req.Tier).enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	if err := a.create(ctx, rt, req, image); err != nil {
		return transient(err)
	}
	return nil
}

func (a *Service) create(ctx context.Context, rt sandbox.Runtime, req noderpc.CreateRequest, image json.RawMessage) error {
	a.mu.Lock()
	if _, dup := a.sandboxes[req.ID]; dup {
		a.mu.Unlock()
		return errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s already exists on node %s", req.ID, a.opt.ID)
	}
	if len(a.sandboxes) >= a.opt.MaxSandboxes {
		a.mu.Unlock()
		return errdefs.New(errdefs.Unavailable, api.CodeNodeFull, "node %s runs its maximum of %d sandboxes", a.opt.ID, a.opt.MaxSandboxes)
	}
	e := &entry{tier: req.Tier}
	a.sandboxes[req.ID] = e
	a.mu.Unlock()

	var cu cleanup.Stack
	defer cu.Clean()
	cu.Add(func() {
		a.mu.Lock()
		delete(a.sandboxes, req.ID)
		a.mu.Unlock()
	})
	ownRoot := rt.Capabilities().OwnRoot
	img, release, err := a.resolveImage(ctx, ownRoot, req.Image)
	if err != nil {
		return err
	}
	cu.Add(release)
	if len(req.Image.Layers) > 0 && !ownRoot {
		// Remembered before the runtime creates anything, so that after a
		// crash at any point the next start knows what this sandbox holds.
		if err := a.state.put(req.ID, req.Tier, req.Image, image); err != nil {
			return err
		}
		cu.Add(func() { a.state.remove(req.ID) })
	}
	sb, err := rt.Create(ctx, sandbox.Spec{
		ID: req.ID, Tier: req.Tier, Image: img, CPU: req.CPU,
		MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, Env: req.Env, Network: req.Network,
		Phases: req.Phases, Capabilities: req.Capabilities,
	})
	if err != nil {
		return err
	}
	cu.Release()
	a.mu.Lock()
	defer a.mu.Unlock()
	e.release = a.releaser(req.ID, release)
	if e.ended != nil && a.sandboxes[req.ID] == e {
		// Ended by itself before we knew it; its runtime released it.
		delete(a.sandboxes, req.ID)
		go e.release()
		return errdefs.New(errdefs.Unavailable, api.CodeSandboxEnded, "sandbox %s ended while it was being created: %s", req.ID, e.ended.Reason())
	}
	if a.sandboxes[req.ID] != e {
		// Destroyed while being created: honour the destroy.
		go func() {
			if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
				a.log.Warn("destroying a sandbox deleted during create", "sandbox", req.ID, "err", err)
			}
			e.release()
		}()
		return errdefs.New(errdefs.Conflict, api.CodeSandboxDeleted, "sandbox %s was deleted while being created", req.ID)
	}
	e.sb = sb
	return nil
}

// Destroy destroys a sandbox. Destroying an unknown sandbox succeeds: the
// control plane retries destroys and must be able to.
func (a *Service) Destroy(ctx context.Context, id string) error {
	a.mu.Lock()
	e, ok := a.sandboxes[id]
	delete(a.sandboxes, id)
	a.mu.Unlock()
	// Transfers in progress would hold the sandbox's destroy up until
	// their client sent the next chunk; end them first.
	a.endSessions(id)
	if !ok || e.sb == nil {
		return nil
	}
	if err := e.sb.Destroy(ctx); err != nil {
		if errdefs.ClassOf(err) == errdefs.Unavailable {
			// Not done yet (a process that cannot die yet): kept for
			// the control plane's retry.
			a.mu.Lock()
			if _, taken := a.sandboxes[id]; !taken {
				a.sandboxes[id] = e
			}
			a.mu.Unlock()
		}
		return err
	}
	e.release()
	return nil
}

// releaser returns a function that frees sandbox id's image view and
// forgets its state, once.
func (a *Service) releaser(id string, release func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			release()
			a.forgetSnapshots(id)
			if a.opt.Steps != nil {
				a.opt.Steps.ForgetSteps(id)
			}
			if a.state != nil {
				a.state.remove(id)
			}
		})
	}
}

// DestroyAll destroys every sandbox of the node (shutdown without
// --keep-sandboxes) and reports each ended (sandbox.EndNodeShutdown).
func (a *Service) DestroyAll(ctx context.Context) {
	// Each is reported ended, so that its record ends now instead of when
	// the node is judged lost; a few reports at a time.
	// The reports share one budget: a control plane that does not
	// answer (no quorum, gone) must not hold the stop for a minute per
	// sandbox. What is not reported is found when the node comes back
	// (reconciliation) or is judged lost.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownReports)
	defer cancel() // after the reports: deferred first, runs last
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	defer wg.Wait() // bounded: each report is bounded by rctx
	for _, s := range a.List() {
		if err := a.Destroy(ctx, s.ID); err != nil {
			a.log.Warn("destroying sandbox at shutdown", "sandbox", s.ID, "err", err)
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a.reportWithin(rctx, s.Tier, sandbox.Ended{ID: s.ID, Code: sandbox.EndNodeShutdown, Detail: "node " + a.opt.ID + " stopped", Status: -1})
		}()
	}
}

// List returns the sandboxes the node runs.
func (a *Service) List() []noderpc.SandboxStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]noderpc.SandboxStatus, 0, len(a.sandboxes))
	for id, e := range a.sandboxes {
		if e.sb != nil {
			out = append(out, noderpc.SandboxStatus{ID: id, Tier: e.tier})
		}
	}
	return out
}

// lookup returns a live sandbox.
func (a *Service) lookup(id string) (sandbox.Sandbox, string, error) {
	a.mu.Lock()
	e, ok := a.sandboxes[id]
	a.mu.Unlock()
	if !ok || e.sb == nil {
		return nil, "", sandbox.ErrGone(id)
	}
	return e.sb, e.tier, nil
}
