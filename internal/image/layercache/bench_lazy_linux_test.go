package layercache

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/lazyblob"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// BenchmarkFirstCommand is the time from a cold node to a first command
// that reads a part of its image: the layer's files fetched whole
// (eager) against loaded on demand (lazy), alternating, from a JetStream
// blob store (the default store, in process here: no network between
// them, which favours eager). The layer is DSEC_BENCH_LAZY_MB (default
// 1,024) files of 1 MiB of random data; the first command reads 6 % or
// 30 % of them whole. Each run starts from an empty layer cache and an
// empty chunk cache; the store's own files may be in the page cache for
// both.
func BenchmarkFirstCommand(b *testing.B) {
	mb := 1024
	if v := os.Getenv("DSEC_BENCH_LAZY_MB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("DSEC_BENCH_LAZY_MB=%q: want a positive number", v)
		}
		mb = n
	}
	e := newEnv(b)
	ctx := context.Background()
	nc, _ := testenv.NATS(b)
	store, err := blobstore.NewNATS(ctx, nc, 1)
	if err != nil {
		b.Fatal(err)
	}
	l := benchImage(b, e, store, mb)
	for _, st := range []struct {
		name  string
		store blobstore.Store
	}{{"", store}, {"-1Gbps", &throttled{Store: store, bytesPerSec: 125e6}}} {
		for _, pct := range []int{6, 30} {
			benchFirstCommand(b, e, st.store, l, fmt.Sprintf("read-%d%%%s", pct, st.name), max(1, mb*pct/100))
		}
	}
}

// benchFirstCommand is one row of BenchmarkFirstCommand: n files read.
func benchFirstCommand(b *testing.B, e *env, store blobstore.Store, l Layer, name string, n int) {
	b.Run(name, func(b *testing.B) {
		var eager, lazy, profiled time.Duration
		var fetched int64
		for i := range b.N {
			eager += firstCommand(b, e, store, l, n, run{id: fmt.Sprint("eager-", i)})
			var st lazyblob.Stats
			var prof []int
			lazy += firstCommand(b, e, store, l, n, run{id: fmt.Sprint("lazy-", i), lazy: true, stats: &st, record: &prof})
			fetched += st.BytesFetched
			// A node that mounts the layer after it: the profile the
			// lazy run recorded is prefetched, from an empty cache too.
			profiled += firstCommand(b, e, store, l, n, run{id: fmt.Sprint("profiled-", i), lazy: true, profile: prof})
		}
		ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
		b.ReportMetric(ms(eager), "eager-ms")
		b.ReportMetric(ms(lazy), "lazy-ms")
		b.ReportMetric(ms(profiled), "profiled-ms")
		b.ReportMetric(float64(eager)/float64(lazy), "eager/lazy")
		b.ReportMetric(float64(eager)/float64(profiled), "eager/profiled")
		b.ReportMetric(float64(fetched)/float64(b.N)/(1<<20), "lazy-fetched-MiB")
	})
}

// throttled is a store behind a link of bytesPerSec, shared by all its
// readers (a node's link to a remote store), for the benchmark's second
// set of rows. Round trips are not slowed, only bytes.
type throttled struct {
	blobstore.Store
	bytesPerSec float64
	mu          sync.Mutex
	free        time.Time // when the link is free again
}

func (t *throttled) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	rc, err := t.Store.ReadRange(ctx, digest, off, n)
	if err != nil {
		return nil, err
	}
	return &throttledReader{ReadCloser: rc, t: t}, nil
}

func (t *throttled) Open(ctx context.Context, digest string) (io.ReadCloser, blobstore.Info, error) {
	rc, info, err := t.Store.Open(ctx, digest)
	if err != nil {
		return nil, info, err
	}
	return &throttledReader{ReadCloser: rc, t: t}, info, nil
}

type throttledReader struct {
	io.ReadCloser
	t *throttled
}

// Read waits until the link has carried what was read.
func (r *throttledReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.t.mu.Lock()
	now := time.Now()
	if r.t.free.Before(now) {
		r.t.free = now
	}
	r.t.free = r.t.free.Add(time.Duration(float64(n) / r.t.bytesPerSec * float64(time.Second)))
	wait := time.Until(r.t.free)
	r.t.mu.Unlock()
	time.Sleep(wait)
	return n, err
}

// benchImage builds the benchmark's layer and stores its files.
func benchImage(b *testing.B, e *env, store blobstore.Store, mb int) Layer {
	src := filepath.Join(e.root, "image")
	for i := range mb {
		p := filepath.Join(src, fmt.Sprintf("d%02d/f%05d", i%32, i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, testenv.RandBytes(uint64(i), 1<<20), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	a, err := layer.BuildDir(context.Background(), src, filepath.Join(e.root, "built"), layer.BuildOptions{TempDir: e.root})
	if err != nil {
		b.Fatal(err)
	}
	if err := os.RemoveAll(src); err != nil {
		b.Fatal(err)
	}
	for _, f := range a.Manifest.Files() {
		r, err := os.Open(filepath.Join(a.Dir, f.Name))
		if err != nil {
			b.Fatal(err)
		}
		_, err = store.Put(context.Background(), f.Ref.Digest, r)
		r.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	return Layer{ID: a.ID(), Manifest: a.Manifest}
}

// run is one first command's setup: eager, lazy (recording the blob's
// access profile if record is set), or lazy with a profile to prefetch.
type run struct {
	id      string
	lazy    bool
	stats   *lazyblob.Stats // set at the end, if not nil
	record  *[]int
	profile []int
}

// staticProfile is a profile store holding one profile for every blob.
type staticProfile []int

func (p staticProfile) Profile(context.Context, string) ([]int, error) { return p, nil }

// firstCommand opens an empty cache, makes a root of l and reads n of
// its files, and returns how long that took; then it cleans up.
func firstCommand(b *testing.B, e *env, store blobstore.Store, l Layer, n int, r run) time.Duration {
	b.Helper()
	ctx := context.Background()
	dir := filepath.Join(e.root, "run-"+r.id)
	opt := Options{Dir: filepath.Join(dir, "layers"), Store: store}
	if r.profile != nil {
		opt.Profiles = staticProfile(r.profile)
	}
	lazy := r.lazy
	var srv *lazyblob.Server
	if lazy {
		var err error
		srv, err = lazyblob.Mount(ctx, lazyblob.Options{Dir: filepath.Join(dir, "lazy"), CacheDir: filepath.Join(dir, "chunks"), Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			b.Fatal(err)
		}
		opt.Lazy = srv
	}
	upper := filepath.Join(dir, "upper")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	c, err := New(ctx, opt)
	if err != nil {
		b.Fatal(err)
	}
	root, release, err := c.Root(ctx, "first", []Layer{l}, upper)
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		f, err := os.Open(filepath.Join(root, fmt.Sprintf("d%02d/f%05d", i%32, i)))
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(start)
	if r.record != nil {
		*r.record, _ = srv.Profile(l.Manifest.Blob.Digest)
	}
	release()
	if err := c.GC(ctx); err != nil {
		b.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		b.Fatal(err)
	}
	if srv != nil {
		if r.stats != nil {
			*r.stats = srv.Stats()
		}
		if err := srv.Close(); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		b.Fatal(err)
	}
	return took
}
