package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// snapSandbox is a fake whose writable state is one file; it records
// the index each capture was given.
type snapSandbox struct {
	*fakeSandbox

	mu      sync.Mutex // guards following fields
	content string
	sinces  []*sandbox.StateIndex
	last    *sandbox.StateIndex
}

func (s *snapSandbox) CaptureState(ctx context.Context, dst string, since *sandbox.StateIndex) (*sandbox.StateIndex, sandbox.CaptureStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sinces = append(s.sinces, since)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, sandbox.CaptureStats{}, err
	}
	if err := os.WriteFile(filepath.Join(dst, "state"), []byte(s.content), 0o644); err != nil {
		return nil, sandbox.CaptureStats{}, err
	}
	// Times as a capture keeps them (the state's, not the copy's).
	at := time.Unix(1700000000, 0)
	for _, p := range []string{filepath.Join(dst, "state"), dst} {
		if err := os.Chtimes(p, at, at); err != nil {
			return nil, sandbox.CaptureStats{}, err
		}
	}
	s.last = &sandbox.StateIndex{}
	return s.last, sandbox.CaptureStats{Entries: 1, Copied: 1, Bytes: int64(len(s.content))}, nil
}

func (s *snapSandbox) since(i int) *sandbox.StateIndex {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sinces[i]
}

// TestSnapshot checks the node's side of snapshots over the wire: the
// layer is built and stored in the blob store, Bytes counts only what the
// store did not hold, the next snapshot is given the last one's index
// (unless Full), a restarted node's first is full; tiers without
// snapshots and unknown sandboxes are refused clearly.
func TestSnapshot(t *testing.T) {
	nc, _ := testenv.NATS(t)
	store, err := blobstore.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	var sb *snapSandbox
	rt := newFakeRuntime(api.TierContainer)
	rt.wrap = func(f *fakeSandbox) sandbox.Sandbox {
		sb = &snapSandbox{fakeSandbox: f, content: "v1"}
		return sb
	}
	vm := newFakeRuntime(api.TierMicroVM)
	reg := sandbox.NewRegistry()
	for _, r := range []sandbox.Runtime{rt, vm} {
		if err := reg.Register(r); err != nil {
			t.Fatal(err)
		}
	}
	start := func(id string) (*Service, func()) {
		a, err := New(Options{ID: id, Registry: reg, Heartbeat: time.Hour, Blobs: store, SnapshotDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(context.Background(), nc, &beats{}); err != nil {
			t.Fatal(err)
		}
		return a, func() { a.Stop(context.Background(), &beats{}) }
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, stop := start("n1")
	c := noderpc.NewClient(nc)
	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "sb", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "vm", Tier: api.TierMicroVM, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}

	r1, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m := r1.Layer.Manifest
	var files int64
	for _, f := range m.Files() {
		files += f.Ref.Size
		if _, err := store.Stat(ctx, f.Ref.Digest); err != nil {
			t.Errorf("the layer's %s (%s) is not in the blob store: %v", f.Name, f.Ref.Digest, err)
		}
	}
	if !r1.Full || r1.Files != 1 || r1.Layer.ID != m.ID() || m.Source.Kind != "state" || !m.HasChunks() || r1.Bytes != files {
		t.Errorf("first snapshot %+v", r1)
	}
	if sb.since(0) != nil {
		t.Error("the first snapshot was given an index")
	}
	// The same state again: the same layer, nothing new stored.
	r2, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Full || r2.Bytes != 0 || r2.Layer.ID != r1.Layer.ID || sb.since(1) == nil {
		t.Errorf("second snapshot of the same state: %+v (since %v)", r2, sb.since(1))
	}
	// Full ignores the index.
	if r3, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{Full: true}); err != nil || !r3.Full || sb.since(2) != nil {
		t.Errorf("full snapshot: %+v %v", r3, err)
	}
	// A tier without snapshots, and a sandbox the node does not have.
	_, err = c.Snapshot(ctx, "n1", "vm", noderpc.SnapshotRequest{})
	wantCode(t, err, errdefs.Unsupported, api.CodeUnsupportedOnTier)
	_, err = c.Snapshot(ctx, "n1", "nope", noderpc.SnapshotRequest{})
	if !errors.Is(err, errdefs.NotFound) {
		t.Errorf("snapshot of an unknown sandbox: %v", err)
	}

	// A restarted node knows no index: its first snapshot is full.
	stop()
	rt.mu.Lock()
	rt.recovered = []string{"sb"}
	rt.mu.Unlock()
	_, stop2 := start("n1")
	defer stop2()
	// (Recover made sb anew: the fake's state is the runtime's, v1.)
	r4, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !r4.Full || r4.Layer.ID != r1.Layer.ID || sb.since(0) != nil {
		t.Errorf("first snapshot after a restart: %+v, want a full one (the first's layer again)", r4)
	}
}
