package layercache

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/lazyblob"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// withChunks gives l a chunk index (stored with its files), as layers
// built by package layer have.
func (e *env) withChunks(l Layer) Layer {
	e.t.Helper()
	p, err := e.store.Path(l.Manifest.Blob.Digest)
	if err != nil {
		e.t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	idx, err := chunks.Build(f, l.Manifest.Blob.Size, layer.ChunkSize)
	if err != nil {
		e.t.Fatal(err)
	}
	js, err := json.Marshal(idx)
	if err != nil {
		e.t.Fatal(err)
	}
	out := filepath.Join(e.root, "chunks-"+hexOf(l)+".json")
	if err := os.WriteFile(out, js, 0o644); err != nil {
		e.t.Fatal(err)
	}
	m := l.Manifest
	m.Chunks = e.put(out)
	return Layer{ID: m.ID(), Manifest: m}
}

// lazyServer mounts a lazy blob server under the test's directory.
func (e *env) lazyServer() *lazyblob.Server {
	e.t.Helper()
	s, err := lazyblob.Mount(context.Background(), lazyblob.Options{
		Dir: filepath.Join(e.root, "lazy"), CacheDir: filepath.Join(e.root, "chunks"),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// TestLazyLayers: layers with a chunk index are cached as metadata and
// index only and read through the lazy blob file, fetching only the
// chunks read; a restart drops the earlier process's dead mounts and
// mounts again over the new server, reusing its chunk cache; a cache
// without on-demand loading fetches such layers whole.
func TestLazyLayers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	big := map[string]string{
		"etc/os-release": "ID=lazy\n",
		"big/a":          random(1, 3<<20),
		"big/b":          random(2, 3<<20),
		"small.txt":      "small",
	}
	base := e.withChunks(e.layer(big))
	top := e.layer(map[string]string{"top.txt": "no index: fetched whole"})
	layers := []Layer{base, top}
	want := map[string]string{"top.txt": "no index: fetched whole"}
	for k, v := range big {
		want[k] = v
	}

	srv := e.lazyServer()
	c := e.open(Options{Lazy: srv})
	upper := filepath.Join(e.root, "sandbox-1")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	root, release, err := c.Root(ctx, "sandbox-1", layers, upper)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "files", hexOf(base), layer.BlobFile)); !os.IsNotExist(err) {
		t.Errorf("the indexed layer's blob was fetched whole: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "files", hexOf(top), layer.BlobFile)); err != nil {
		t.Errorf("the layer without an index was not fetched whole: %v", err)
	}
	nChunks := int((base.Manifest.Blob.Size + layer.ChunkSize - 1) / layer.ChunkSize)
	checkFiles(t, root, map[string]string{"small.txt": "small"})
	if st := srv.Stats(); st.ChunksFetched == 0 || st.ChunksFetched >= int64(nChunks) {
		t.Errorf("reading one small file fetched %d of %d chunks", st.ChunksFetched, nChunks)
	}
	checkFiles(t, root, want)
	if st := srv.Stats(); st.ChunksFetched > int64(nChunks) || st.ChunksCorrupt != 0 {
		t.Errorf("reading everything: %+v, of %d chunks", st, nChunks)
	}
	if s := c.Stats(); s.Bytes >= base.Manifest.Blob.Size {
		t.Errorf("the cache counts %d bytes for a lazily loaded layer of %d", s.Bytes, base.Manifest.Blob.Size)
	}
	release()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// A restart: the old server's connection ends with it (its layer
	// mount is left behind, as a crash leaves it); the new cache detaches
	// that mount and mounts the layer again over the new server, whose
	// chunks are all in its cache.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mountsByType(t, e.dir)["erofs"]; got != 2 {
		t.Fatalf("%d layer mounts left by the first run, want both", got)
	}
	srv = e.lazyServer()
	c = e.open(Options{Lazy: srv})
	if got := mountsByType(t, e.dir)["erofs"]; got != 1 {
		t.Errorf("%d layer mounts adopted, want 1: the lazily loaded one is dead and must go", got)
	}
	root, release, err = c.Root(ctx, "sandbox-2", layers, upper)
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, root, want)
	if st := srv.Stats(); st.ChunksFetched != 0 || st.CacheHits == 0 {
		t.Errorf("after the restart: %+v, want every chunk from the cache", st)
	}
	release()
	gcAndCheckEmpty(t, c, e.dir)

	// Every chunk is in hand: the next mount promotes the layer to a
	// whole one over the chunk cache's file (the same inode, no copy),
	// and reads no longer go through the server.
	before := c.Stats().Bytes
	root, release, err = c.Root(ctx, "sandbox-2b", layers, upper)
	if err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(e.dir, "files", hexOf(base), layer.BlobFile)
	fi, err := os.Stat(blob)
	if err != nil {
		t.Fatalf("not promoted: %v", err)
	}
	cached, err := os.Stat(filepath.Join(e.root, "chunks", strings.TrimPrefix(base.Manifest.Blob.Digest, "sha256:")+".data"))
	if err != nil || !os.SameFile(fi, cached) {
		t.Errorf("the promoted blob is not the chunk cache's file: %v", err)
	}
	if got := c.Stats().Bytes - before; got != base.Manifest.Blob.Size {
		t.Errorf("promotion counted %d bytes, want the blob's %d", got, base.Manifest.Blob.Size)
	}
	hits := srv.Stats().CacheHits
	checkFiles(t, root, want)
	if st := srv.Stats(); st.CacheHits != hits || st.ChunksFetched != 0 {
		t.Errorf("reads of a promoted layer went through the server: %+v", st)
	}
	release()
	gcAndCheckEmpty(t, c, e.dir)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	// Without on-demand loading, the lazily cached layer is fetched whole.
	c = e.open(Options{})
	defer c.Close(ctx)
	root, release, err = c.Root(ctx, "sandbox-3", layers, upper)
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, root, want)
	if _, err := os.Stat(filepath.Join(e.dir, "files", hexOf(base), layer.BlobFile)); err != nil {
		t.Errorf("without on-demand loading the blob was not fetched: %v", err)
	}
	release()
	gcAndCheckEmpty(t, c, e.dir)
}

// TestLazyPrefetch: a lazily loaded layer with an access profile has the
// chunks it lists fetched when it is mounted, before anything reads
// them; without one nothing is fetched until a read.
func TestLazyPrefetch(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	base := e.withChunks(e.layer(map[string]string{"big/a": random(3, 4<<20), "small.txt": "small"}))
	for _, profiled := range []bool{false, true} {
		// A node of its own each time: its own layer and chunk caches.
		node := filepath.Join(e.root, fmt.Sprintf("node-%v", profiled))
		srv, err := lazyblob.Mount(ctx, lazyblob.Options{Dir: filepath.Join(node, "lazy"), CacheDir: filepath.Join(node, "chunks")})
		if err != nil {
			t.Fatal(err)
		}
		opt := Options{Lazy: srv, Dir: filepath.Join(node, "layers")}
		if profiled {
			opt.Profiles = staticProfile{3, 1, 2}
		}
		c := e.open(opt)
		upper := filepath.Join(node, "upper")
		if err := os.Mkdir(upper, 0o755); err != nil {
			t.Fatal(err)
		}
		_, release, err := c.Root(ctx, "prefetch", []Layer{base}, upper)
		if err != nil {
			t.Fatal(err)
		}
		if profiled {
			testenv.Eventually(t, 10*time.Second, "the profile's 3 chunks to be prefetched", func() bool {
				return srv.Stats().ChunksFetched >= 3
			})
		} else {
			time.Sleep(200 * time.Millisecond)
			if n := srv.Stats().ChunksFetched; n > 1 {
				t.Errorf("without a profile, mounting fetched %d chunks", n)
			}
		}
		release()
		if err := c.GC(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
