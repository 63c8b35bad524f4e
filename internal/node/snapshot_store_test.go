package node

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// adoptingLayers is the layer cache with Adopt: it records what it took.
type adoptingLayers struct {
	*fakeLayers
	mu      sync.Mutex // guards following field
	adopted []string
}

func (l *adoptingLayers) Adopt(ctx context.Context, art layer.Artifact) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.adopted = append(l.adopted, art.ID())
	return nil
}

// gatedStore is a blob store whose Puts wait for open (or fail with
// failing set).
type gatedStore struct {
	*blobstore.Local
	open    chan struct{}
	mu      sync.Mutex // guards following field
	failing bool
}

func (s *gatedStore) Put(ctx context.Context, digest string, r io.Reader) (blobstore.Info, error) {
	select {
	case <-s.open:
	case <-ctx.Done():
		return blobstore.Info{}, ctx.Err()
	}
	s.mu.Lock()
	failing := s.failing
	s.mu.Unlock()
	if failing {
		return blobstore.Info{}, errors.New("the store is broken")
	}
	return s.Local.Put(ctx, digest, r)
}

// TestSnapshotBackground: a Background snapshot answers once the layer
// is built and in the node's layer cache, before its upload; Stored
// waits for the upload and reports its bytes, and after the node forgot
// the upload it asks the store. A failed upload is reported by Stored
// and makes the sandbox's next snapshot a full one.
func TestSnapshotBackground(t *testing.T) {
	nc, _ := testenv.NATS(t)
	local, err := blobstore.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	store := &gatedStore{Local: local, open: make(chan struct{})}
	var sb *snapSandbox
	rt := newFakeRuntime(api.TierContainer)
	rt.wrap = func(f *fakeSandbox) sandbox.Sandbox {
		sb = &snapSandbox{fakeSandbox: f, content: "v1"}
		return sb
	}
	reg := sandbox.NewRegistry()
	if err := reg.Register(rt); err != nil {
		t.Fatal(err)
	}
	layers := &adoptingLayers{fakeLayers: newFakeLayers()}
	a, err := New(Options{ID: "n1", Registry: reg, Heartbeat: time.Hour, Blobs: store, Layers: layers,
		StateDir: t.TempDir(), SnapshotDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background(), nc, &beats{}); err != nil {
		t.Fatal(err)
	}
	defer a.Stop(context.Background(), &beats{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c := noderpc.NewClient(nc)
	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "sb", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}

	r, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Stored || r.Bytes != 0 || !r.Full {
		t.Errorf("background snapshot answered %+v, want it not stored yet", r)
	}
	layers.mu.Lock()
	if len(layers.adopted) != 1 || layers.adopted[0] != r.Layer.ID {
		t.Errorf("the layer cache adopted %q, want %s", layers.adopted, r.Layer.ID)
	}
	layers.mu.Unlock()
	if _, err := local.Stat(ctx, r.Layer.Manifest.Blob.Digest); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("the blob is in the store before its upload was let through: %v", err)
	}
	got := make(chan error, 1)
	var sr noderpc.StoredReply
	go func() {
		var err error
		sr, err = c.Stored(ctx, "n1", "sb", r.Layer)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Stored answered (%v) while the upload waits", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(store.open)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("Stored did not answer after the upload")
	}
	var files int64
	for _, f := range r.Layer.Manifest.Files() {
		files += f.Ref.Size
		if _, err := local.Stat(ctx, f.Ref.Digest); err != nil {
			t.Errorf("after Stored, the layer's %s is not in the store: %v", f.Name, err)
		}
	}
	if sr.Bytes != files {
		t.Errorf("Stored reported %d bytes, want %d", sr.Bytes, files)
	}
	// Forgotten by the node: the store says.
	a.smu.Lock()
	clear(a.stores)
	a.smu.Unlock()
	if _, err := c.Stored(ctx, "n1", "sb", r.Layer); err != nil {
		t.Errorf("Stored of a layer the store holds, after the node forgot the upload: %v", err)
	}
	other := r.Layer
	other.Manifest.Blob.Digest = layer.Digest([]byte("never stored"))
	other.ID = other.Manifest.ID()
	_, err = c.Stored(ctx, "n1", "sb", other)
	wantCode(t, err, errdefs.NotFound, api.CodeLayerNotFound)

	// A failed upload: Stored says so, and the next snapshot is full.
	store.mu.Lock()
	store.failing = true
	store.mu.Unlock()
	sb.mu.Lock()
	sb.content = "v2"
	sb.mu.Unlock()
	r2, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Full {
		t.Errorf("second snapshot %+v, want one on the first", r2)
	}
	if _, err := c.Stored(ctx, "n1", "sb", r2.Layer); err == nil {
		t.Error("Stored of a failed upload reported no error")
	}
	store.mu.Lock()
	store.failing = false
	store.mu.Unlock()
	r3, err := c.Snapshot(ctx, "n1", "sb", noderpc.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !r3.Full || !r3.Stored {
		t.Errorf("the snapshot after a failed upload: %+v, want a full, stored one", r3)
	}
}
