package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// memData is an in-memory sandbox bucket with the semantics of the
// JetStream one behind store.Store: records are stored encoded (a caller
// keeps no alias of them), every write takes the bucket's next revision,
// an update at a stale revision fails with Conflict, and a watch skips
// the writes of the handle that registered it. Several handles (memStore)
// share one memData, as several Stores share one server.
type memData struct {
	mu       sync.Mutex // guards following fields
	rev      uint64     // the bucket's last revision
	recs     map[string]memRec
	watchers []*memWatch
	// held queues the watches' deliveries (a watch lagging the store)
	// until release.
	held    bool
	queue   []memDelivery
	events  []store.Event
	nodes   []api.Node
	updates int // UpdateSandbox calls, conflicts included
	snaps   map[string]store.SnapshotRecord
	// requests are idempotent creates' keys.
	requests map[string]store.RequestRecord
}

type memRec struct {
	b   []byte
	rev uint64
}

type memWatch struct {
	owner *memStore
	ctx   context.Context
	fn    func(*store.SandboxChange)
}

type memDelivery struct {
	w  *memWatch
	ch store.SandboxChange
}

// memStore is one handle on a memData (one store.Store). Its hooks let a
// test act between a read and a write, or make calls fail.
type memStore struct {
	d *memData
	// beforeUpdate, if set, runs at the start of every UpdateSandbox,
	// outside the lock: another writer may write then.
	beforeUpdate func(id string)
	// failCreate, failUpdate and failPurge, if set, fail those calls
	// without writing.
	failCreate, failUpdate, failPurge error
}

func newMemStore() *memStore {
	return &memStore{d: &memData{recs: map[string]memRec{}, snaps: map[string]store.SnapshotRecord{}}}
}

func (s *memStore) PutSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, ok := s.d.snaps[r.ID]; ok {
		return errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "snapshot %s exists", r.ID)
	}
	s.d.snaps[r.ID] = r
	return nil
}

func (s *memStore) ClaimRequest(ctx context.Context, key string, rec store.RequestRecord) (store.RequestRecord, bool, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.d.requests == nil {
		s.d.requests = map[string]store.RequestRecord{}
	}
	if got, ok := s.d.requests[key]; ok {
		return got, false, nil
	}
	s.d.requests[key] = rec
	return rec, true, nil
}

func (s *memStore) ReleaseRequest(ctx context.Context, key string) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	delete(s.d.requests, key)
	return nil
}

func (s *memStore) UpdateSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, ok := s.d.snaps[r.ID]; !ok {
		return errdefs.New(errdefs.NotFound, api.CodeSnapshotNotFound, "snapshot %s not found", r.ID)
	}
	s.d.snaps[r.ID] = r
	return nil
}

func (s *memStore) GetSnapshot(ctx context.Context, id string) (store.SnapshotRecord, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	r, ok := s.d.snaps[id]
	if !ok {
		return r, errdefs.New(errdefs.NotFound, api.CodeSnapshotNotFound, "snapshot %q not found", id)
	}
	return r, nil
}

func (s *memStore) DeleteSnapshot(ctx context.Context, id string) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	delete(s.d.snaps, id)
	return nil
}

func (s *memStore) ListSnapshots(ctx context.Context) ([]store.SnapshotRecord, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return slices.Collect(maps.Values(s.d.snaps)), nil
}

// peer returns another writer on the same data, whose writes this
// handle's watch delivers.
func (s *memStore) peer() *memStore { return &memStore{d: s.d} }

func (s *memStore) GetSandbox(ctx context.Context, id string) (store.SandboxRecord, uint64, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	r, ok := s.d.recs[id]
	if !ok {
		return store.SandboxRecord{}, 0, errdefs.New(errdefs.NotFound, api.CodeSandboxNotFound, "sandbox %q not found", id)
	}
	var rec store.SandboxRecord
	if err := json.Unmarshal(r.b, &rec); err != nil {
		return rec, 0, err
	}
	return rec, r.rev, nil
}

func (s *memStore) CreateSandbox(ctx context.Context, rec store.SandboxRecord) (uint64, error) {
	if s.failCreate != nil {
		return 0, s.failCreate
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, ok := s.d.recs[rec.ID]; ok {
		return 0, errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %q already exists", rec.ID)
	}
	return s.putLocked(rec)
}

func (s *memStore) UpdateSandbox(ctx context.Context, rec store.SandboxRecord, rev uint64) (uint64, error) {
	if s.beforeUpdate != nil {
		s.beforeUpdate(rec.ID)
	}
	if s.failUpdate != nil {
		return 0, s.failUpdate
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.updates++
	if cur, ok := s.d.recs[rec.ID]; !ok || cur.rev != rev {
		return 0, errdefs.New(errdefs.Conflict, api.CodeRevisionMismatch, "sandbox %q changed concurrently", rec.ID)
	}
	return s.putLocked(rec)
}

// Preconditions: s.d.mu must be held.
func (s *memStore) putLocked(rec store.SandboxRecord) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	s.d.rev++
	s.d.recs[rec.ID] = memRec{b: b, rev: s.d.rev}
	var dec store.SandboxRecord
	_ = json.Unmarshal(b, &dec)
	s.deliverLocked(store.SandboxChange{Record: dec, Revision: s.d.rev})
	return s.d.rev, nil
}

func (s *memStore) PurgeSandbox(ctx context.Context, id string) error {
	if s.failPurge != nil {
		return s.failPurge
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if _, ok := s.d.recs[id]; !ok {
		return nil
	}
	delete(s.d.recs, id)
	s.d.rev++
	ch := store.SandboxChange{Revision: s.d.rev, Deleted: true}
	ch.Record.ID = id
	s.deliverLocked(ch)
	return nil
}

// deliverLocked hands a change to every watch, in revision order (now,
// or at release if held), but a record written by the watch's own
// handle: as store.Store's watch, it skips those (their writer applies
// them) and delivers purges, its own included.
//
// Preconditions: s.d.mu must be held.
func (s *memStore) deliverLocked(ch store.SandboxChange) {
	for _, w := range s.d.watchers {
		if w.owner == s && !ch.Deleted || w.ctx.Err() != nil {
			continue
		}
		if s.d.held {
			s.d.queue = append(s.d.queue, memDelivery{w, ch})
			continue
		}
		c := ch
		w.fn(&c)
	}
}

// hold makes the watches lag: changes wait until release.
func (s *memStore) hold() {
	s.d.mu.Lock()
	s.d.held = true
	s.d.mu.Unlock()
}

func (s *memStore) release() {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.held = false
	for _, q := range s.d.queue {
		if q.w.ctx.Err() == nil {
			c := q.ch
			q.w.fn(&c)
		}
	}
	s.d.queue = nil
}

func (s *memStore) WatchSandboxes(ctx context.Context, log *slog.Logger, known func(string, uint64) bool, fn func(*store.SandboxChange)) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	for _, r := range s.d.recs {
		ch := store.SandboxChange{Revision: r.rev}
		if err := json.Unmarshal(r.b, &ch.Record); err != nil {
			return err
		}
		fn(&ch)
	}
	fn(nil)
	s.d.watchers = append(s.d.watchers, &memWatch{owner: s, ctx: ctx, fn: fn})
	return nil
}

func (s *memStore) PublishEvent(ctx context.Context, e store.Event) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.events = append(s.d.events, e)
	return nil
}

func (s *memStore) AuditEvents(ctx context.Context, id string, skip, limit int) ([]api.AuditEvent, error) {
	return []api.AuditEvent{}, nil
}

func (s *memStore) FollowAuditEvents(ctx context.Context, id string, skip int, fn func(api.AuditEvent) error) error {
	<-ctx.Done() // bounded: ends with the caller's context, as the store's follow does
	return ctx.Err()
}

func (s *memStore) ListNodes(ctx context.Context) ([]api.Node, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return slices.Clone(s.d.nodes), nil
}

func (s *memStore) SetNodeAdmin(ctx context.Context, id string, a store.NodeAdmin) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	for i := range s.d.nodes {
		if s.d.nodes[i].ID == id {
			s.d.nodes[i].Cordoned, s.d.nodes[i].Draining, s.d.nodes[i].DrainDeadline = a.Cordoned || a.Draining, a.Draining, a.DrainDeadline
		}
	}
	return nil
}

// setNodes replaces the heartbeats.
func (s *memStore) setNodes(nodes ...api.Node) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.d.nodes = nodes
}

// record returns the stored record of id, failing the test if absent.
func (s *memStore) record(t *testing.T, id string) store.SandboxRecord {
	t.Helper()
	rec, _, err := s.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatalf("record %s: %v", id, err)
	}
	return rec
}

// has reports whether a record of id is stored.
func (s *memStore) has(id string) bool {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	_, ok := s.d.recs[id]
	return ok
}

// eventsOf returns the lifecycle events of sandbox id as "from>to".
func (s *memStore) eventsOf(id string) []string {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	var out []string
	for _, e := range s.d.events {
		if e.Sandbox == id {
			out = append(out, string(e.From)+">"+string(e.State))
		}
	}
	return out
}

// fakeNodes is the nodes as the control plane reaches them: each runs a
// set of sandboxes; Create adds one (Conflict if present), Destroy removes
// one (an unknown one succeeds, as on a node). Hooks decide other
// outcomes. Commands and files are not faked: calling them panics.
type fakeNodes struct {
	nodeCommands
	nodeFiles

	mu       sync.Mutex                   // guards following fields
	running  map[string]map[string]string // node → sandbox → tier
	creates  []string                     // "node/id", in call order
	destroys []string                     // "node/id", in call order
	phases   []string                     // "node/id/phase"
	lastReq  noderpc.CreateRequest
	// onCreate, if set, runs first; an error is the node's answer, and
	// nothing is added.
	onCreate func(node string, req noderpc.CreateRequest) error
	// onDestroy, if set, runs first; an error is the node's answer, and
	// the sandbox stays.
	onDestroy func(node, id string) error
	listErr   error
	phaseErr  error
	ended     func(noderpc.EndedReport) error
}

func newFakeNodes() *fakeNodes { return &fakeNodes{running: map[string]map[string]string{}} }

func (f *fakeNodes) Create(ctx context.Context, node string, req noderpc.CreateRequest) error {
	f.mu.Lock()
	f.creates = append(f.creates, node+"/"+req.ID)
	f.lastReq = req
	hook := f.onCreate
	f.mu.Unlock()
	if hook != nil {
		if err := hook(node, req); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[node][req.ID]; ok {
		return errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s already exists on node %s", req.ID, node)
	}
	f.addLocked(node, req.ID, req.Tier)
	return nil
}

// Preconditions: f.mu must be held.
func (f *fakeNodes) addLocked(node, id, tier string) {
	if f.running[node] == nil {
		f.running[node] = map[string]string{}
	}
	f.running[node][id] = tier
}

// run makes node run sandbox id (one a previous control plane made).
func (f *fakeNodes) run(node, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addLocked(node, id, api.TierFunction)
}

func (f *fakeNodes) Destroy(ctx context.Context, node, id string) error {
	f.mu.Lock()
	f.destroys = append(f.destroys, node+"/"+id)
	hook := f.onDestroy
	f.mu.Unlock()
	if hook != nil {
		if err := hook(node, id); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running[node], id)
	return nil
}

func (f *fakeNodes) List(ctx context.Context, node string) ([]noderpc.SandboxStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []noderpc.SandboxStatus
	for id, tier := range f.running[node] {
		out = append(out, noderpc.SandboxStatus{ID: id, Tier: tier})
	}
	return out, nil
}

func (f *fakeNodes) SetPhase(ctx context.Context, node, id string, p api.Phase) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.phases = append(f.phases, node+"/"+id+"/"+p.Name)
	return f.phaseErr
}

func (f *fakeNodes) Snapshot(ctx context.Context, node, id string, req noderpc.SnapshotRequest) (noderpc.SnapshotReply, error) {
	return noderpc.SnapshotReply{}, errors.New("Snapshot is not faked")
}

func (f *fakeNodes) Stored(ctx context.Context, node, id string, layer noderpc.LayerRef) (noderpc.StoredReply, error) {
	return noderpc.StoredReply{}, errors.New("Stored is not faked")
}

func (f *fakeNodes) ServeEnded(handle func(noderpc.EndedReport) error) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = handle
	return func() {
		f.mu.Lock()
		f.ended = nil
		f.mu.Unlock()
	}, nil
}

// runs reports whether node runs sandbox id.
func (f *fakeNodes) runs(node, id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.running[node][id]
	return ok
}

func (f *fakeNodes) destroyed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.destroys)
}

func (f *fakeNodes) created() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.creates)
}

// fakeImages resolves every name but "missing" to a directory image for
// tiers (empty: every tier).
type fakeImages struct {
	tiers []string
}

func (f fakeImages) Resolve(ctx context.Context, ref string) (image.Resolved, error) {
	if ref == "missing" {
		return image.Resolved{}, errdefs.New(errdefs.NotFound, api.CodeImageNotFound, "image %q not found", ref)
	}
	return image.Resolved{ID: "img-" + ref, Name: ref, Manifest: store.ImageManifest{Version: 1, Source: "dir:/images/" + ref, Tiers: f.tiers}}, nil
}

func (f fakeImages) Compose(ctx context.Context, layers []api.ImageLayer, tiers []string) (image.Resolved, error) {
	return image.Resolved{}, errors.New("Compose is not faked")
}

func (f fakeImages) LayerPaths(ctx context.Context, id string) (map[string]bool, error) {
	return nil, errors.New("LayerPaths is not faked")
}

func (f fakeImages) ReadLayerFile(ctx context.Context, id, p string, max int64) ([]byte, error) {
	return nil, errors.New("ReadLayerFile is not faked")
}

func (f fakeImages) Stack(ctx context.Context, base string, top []api.ImageLayer, tiers []string) (image.Resolved, error) {
	return image.Resolved{}, errors.New("Stack is not faked")
}

func (f fakeImages) RegisterLayer(ctx context.Context, m layer.Manifest, uploading bool) (store.LayerRecord, error) {
	return store.LayerRecord{}, errors.New("RegisterLayer is not faked")
}

// storeTimeout is a store write that timed out.
var storeTimeout = fmt.Errorf("writing sandbox: %w", context.DeadlineExceeded)

// nodeGone is a node that does not answer.
var nodeGone = errdefs.New(errdefs.Unavailable, api.CodeNodeUnavailable, "node n1 is not reachable")

// testNode is a fresh, ready node running the function and container
// tiers with room for max sandboxes.
func testNode(id string, max int) api.Node {
	return api.Node{ID: id, Ready: true, LastSeen: time.Now(), Capacity: api.Capacity{MaxSandboxes: max},
		Tiers: []api.TierInfo{{Name: api.TierFunction, Available: true}, {Name: api.TierContainer, Available: true}}}
}

// harness is a manager on a memStore and fakeNodes, not started: tests
// drive its loops' steps (reconcile, reap, failNode) themselves, or call
// start.
type harness struct {
	t     *testing.T
	m     *Manager
	st    *memStore
	nodes *fakeNodes
}

func newHarness(t *testing.T, opt Options) *harness {
	t.Helper()
	h := &harness{t: t, st: newMemStore(), nodes: newFakeNodes()}
	opt.Store, opt.Nodes = h.st, h.nodes
	if opt.Images == nil {
		opt.Images = fakeImages{}
	}
	if opt.Limits.DefaultImages == nil {
		opt.Limits.DefaultImages = map[string]string{api.TierFunction: "fn", api.TierContainer: "ct"}
	}
	h.m = New(opt)
	h.st.setNodes(testNode("n1", 10))
	h.m.refreshNodes(context.Background())
	t.Cleanup(func() { h.m.Stop() })
	return h
}

// start runs the manager's Start (records loaded, loops running).
func (h *harness) start(t *testing.T) {
	t.Helper()
	if err := h.m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// seed stores a record, as a previous control plane left it, and puts
// it in the manager's cache as its watch would.
func (h *harness) seed(t *testing.T, rec store.SandboxRecord) store.SandboxRecord {
	t.Helper()
	if rec.Owner == "" {
		rec.Owner = "o"
	}
	if rec.Tier == "" {
		rec.Tier = api.TierFunction
	}
	if rec.Node == "" {
		rec.Node = "n1"
	}
	if rec.StateSince.IsZero() {
		rec.StateSince = time.Now().Add(-time.Hour).UTC()
	}
	if rec.ExpiresAt.IsZero() {
		rec.ExpiresAt = time.Now().Add(time.Hour).UTC()
	}
	if rec.EndedAt == nil && (rec.State == api.StateStopped || rec.State == api.StateFailed) {
		e := rec.StateSince
		rec.EndedAt = &e
	}
	rev, err := h.st.peer().CreateSandbox(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	h.m.cache.apply(rec, rev)
	return rec
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// wantErr checks err's class and code.
func wantErr(t *testing.T, err error, class errdefs.Class, code string) {
	t.Helper()
	if errdefs.ClassOf(err) != class || errdefs.CodeOf(err) != code {
		t.Fatalf("error %v (%s %s), want %s %s", err, errdefs.ClassOf(err), errdefs.CodeOf(err), class, code)
	}
}

func (h *harness) state(t *testing.T, id string) api.State {
	t.Helper()
	return h.st.record(t, id).State
}

func sbID(i int) string { return fmt.Sprintf("sb-%02d", i) }

// wait bounds every wait of these tests: long enough for a loaded
// machine, short enough that a hung test fails instead of hanging its
// package.
const wait = 30 * time.Second

// hold blocks a fake's call until the test lets it go, or until wait
// has passed, so that a test that failed before letting it go cannot
// leave the call blocked.
func hold(proceed <-chan struct{}) {
	select {
	case <-proceed:
	case <-time.After(wait):
	}
}
