package vmtier

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/image/lazyblob"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestLazyLayerDisks boots a microVM whose layers are loaded on demand:
// its disks are the files the lazy server serves, and the guest reads
// only some of their chunks to boot and run a command.
func TestLazyLayerDisks(t *testing.T) {
	w := world.get(t)
	ctx := ctxT(t, 3*time.Minute)
	dir := t.TempDir()
	srv, err := lazyblob.Mount(ctx, lazyblob.Options{Dir: filepath.Join(dir, "lazy"), CacheDir: filepath.Join(dir, "chunks")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cache, err := layercache.New(ctx, layercache.Options{Dir: filepath.Join(dir, "layers"), Store: w.store, Lazy: srv})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cache.GC(context.Background()); err != nil {
			t.Error(err)
		}
		cache.Close(context.Background())
	}()
	var layers []layerspec.Layer
	var total int
	for _, l := range w.layers {
		l = withChunks(t, w, l)
		layers = append(layers, l)
		total += chunks.Count(l.Manifest.Blob.Size, l.Manifest.ChunkSize)
	}

	guest, err := builtin.GuestBinary("test")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(ctx, Options{
		StateDir: filepath.Join(dir, "vms"), CacheDir: kernelCache, Guest: guest, Version: "test",
		Layers: CacheFiles{Cache: cache},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	spec := busyboxSpec("mvm-lazy", Tier)
	spec.Image.Layers = layers
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create over lazily loaded layers: %v", err)
	}
	defer sb.Destroy(context.Background())
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"cat", "/etc/hostname"}}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a command in the lazily booted VM: %+v, %v", res, err)
	}
	st := srv.Stats()
	t.Logf("the VM read %d of its layers' %d chunks (%d bytes)", st.ChunksFetched, total, st.BytesFetched)
	if st.ChunksFetched == 0 || st.ChunksCorrupt != 0 || st.FetchFailures != 0 {
		t.Errorf("lazy blob stats %+v: the disks did not go through the lazy server", st)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// withChunks gives l a chunk index (stored with its files), as layers
// built by this version have; the world's built-in layers may come from a
// cache of an older build.
func withChunks(t *testing.T, w *testWorld, l layerspec.Layer) layerspec.Layer {
	t.Helper()
	p, err := w.store.Path(l.Manifest.Blob.Digest)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	idx, err := chunks.Build(f, l.Manifest.Blob.Size, l.Manifest.ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	d := layer.Digest(js)
	if _, err := w.store.Put(context.Background(), d, bytes.NewReader(js)); err != nil {
		t.Fatal(err)
	}
	m := l.Manifest
	m.Chunks = layer.FileRef{Digest: d, Size: int64(len(js))}
	return layerspec.Layer{ID: m.ID(), Manifest: m}
}
