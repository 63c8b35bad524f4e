package lazyblob

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/testenv"
)

const testChunk = 4096

// openBlob serves idx from src with a cache in dir; the test's cleanup
// closes it.
func openBlob(t testing.TB, dir string, idx chunks.Index, src Source, timeout time.Duration) (*blob, *counters, *logBuffer) {
	t.Helper()
	cache, err := openCache(dir, idx)
	if err != nil {
		t.Fatal(err)
	}
	stats := &counters{}
	log, lb := newLog()
	b := newBlob(idx, src, cache, stats, log, timeout)
	t.Cleanup(func() {
		if err := b.close(); err != nil {
			t.Errorf("closing the blob: %v", err)
		}
	})
	return b, stats, lb
}

// readBlob reads [off, off+n) through b as the FUSE server does.
func readBlob(ctx context.Context, b *blob, off, n int64) ([]byte, error) {
	return b.read(ctx, make([]byte, n), off, n)
}

func TestBlobReads(t *testing.T) {
	data := testenv.RandBytes(10, 5*testChunk+100)
	st, idx := storeBlob(t, data, testChunk)
	src := countReads(st)
	b, stats, _ := openBlob(t, t.TempDir(), idx, src, 10*time.Second)
	ctx := context.Background()
	for _, r := range []struct{ off, n int64 }{
		{0, 1}, {100, 5000}, {testChunk - 1, 2}, {3*testChunk + 5, 2*testChunk + 95}, {0, int64(len(data))},
	} {
		got, err := readBlob(ctx, b, r.off, r.n)
		if err != nil {
			t.Fatalf("read %d+%d: %v", r.off, r.n, err)
		}
		if !bytes.Equal(got, data[r.off:r.off+r.n]) {
			t.Fatalf("read %d+%d: wrong bytes", r.off, r.n)
		}
	}
	offs, total := src.reads()
	if total != 6 {
		t.Errorf("%d reads from the source (%v), want 6: each chunk once", total, offs)
	}
	s := stats.snapshot()
	if s.ChunksFetched != 6 || s.BytesFetched != int64(len(data)) || s.FetchFailures != 0 || s.CacheHits == 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestBlobOneFetchPerChunk: readers of one chunk at once share its fetch.
func TestBlobOneFetchPerChunk(t *testing.T) {
	data := testenv.RandBytes(11, 2*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	gate := &gatedSource{src: countReads(st), open: make(chan struct{}), entered: make(chan struct{}, 8)}
	b, stats, _ := openBlob(t, t.TempDir(), idx, gate, 10*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := readBlob(context.Background(), b, int64(i*100), 100)
			if err == nil && !bytes.Equal(got, data[i*100:i*100+100]) {
				err = errors.New("wrong bytes")
			}
			errs <- err
		}()
	}
	testenv.Recv(t, gate.entered, 10*time.Second, "the first fetch to reach the source")
	// Let the readers pile up on the fetch before it returns.
	testenv.Eventually(t, 10*time.Second, "8 readers waiting for the fetch", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.flights) == 1 && b.flights[0].waiters == 8
	})
	close(gate.open)
	testenv.WaitGroup(t, &wg, 10*time.Second, "the readers")
	for range 8 {
		if err := testenv.Recv(t, errs, time.Second, "a reader's result"); err != nil {
			t.Error(err)
		}
	}
	if _, total := gate.src.(*countingSource).reads(); total != 1 {
		t.Errorf("%d fetches of the chunk, want 1", total)
	}
	if s := stats.snapshot(); s.ChunksFetched != 1 || s.CacheHits != 0 {
		t.Errorf("stats %+v, want one chunk fetched and no cache hits", s)
	}
}

// gatedSource holds every read until open is closed.
type gatedSource struct {
	src     Source
	open    chan struct{}
	entered chan struct{}
}

func (g *gatedSource) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	g.entered <- struct{}{}
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.src.ReadRange(ctx, digest, off, n)
}

func TestBlobCorruptChunk(t *testing.T) {
	data := testenv.RandBytes(12, 3*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	corruptStored(t, st, idx.Digest, testChunk+10, 1)
	b, stats, lb := openBlob(t, t.TempDir(), idx, st, 10*time.Second)
	ctx := context.Background()
	for range 2 { // not cached: the second read fetches it again
		_, err := readBlob(ctx, b, testChunk, 100)
		testenv.WantError(t, err, errdefs.Internal, api.CodeChunkCorrupt)
	}
	if s := stats.snapshot(); s.ChunksCorrupt != 2 || s.FetchFailures != 2 || s.ChunksFetched != 0 {
		t.Errorf("stats %+v, want 2 corrupt fetches", s)
	}
	if b.cache.chunk(1) != chunkAbsent {
		t.Error("the corrupt chunk is in the cache")
	}
	if !lb.contains("level=WARN") || !lb.contains("does not match its digest") {
		t.Errorf("no warning logged:\n%s", lb)
	}
	// The other chunks read fine.
	for _, off := range []int64{0, 2 * testChunk} {
		got, err := readBlob(ctx, b, off, testChunk)
		if err != nil || !bytes.Equal(got, data[off:off+testChunk]) {
			t.Errorf("chunk at %d: %v", off, err)
		}
	}
	// A read spanning a good and the bad chunk fails whole.
	_, err := readBlob(ctx, b, testChunk-10, 20)
	testenv.WantError(t, err, errdefs.Internal, api.CodeChunkCorrupt)
}

// flakySource fails its first fails reads, as a store that hiccups
// under load, then reads from the real one.
type flakySource struct {
	Source
	mu    sync.Mutex
	fails int
}

func (f *flakySource) ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails > 0 {
		f.fails--
		return nil, errors.New("nats: timeout")
	}
	return f.Source.ReadRange(ctx, digest, off, n)
}

// TestBlobFetchRetried: a source error is tried again within the
// deadline, and the read succeeds; with no deadline left it is an EIO
// (a timeout) naming the last error.
func TestBlobFetchRetried(t *testing.T) {
	data := testenv.RandBytes(13, 2*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	src := &flakySource{Source: st, fails: 2}
	b, stats, lb := openBlob(t, t.TempDir(), idx, src, 10*time.Second)
	got, err := readBlob(context.Background(), b, 0, testChunk)
	if err != nil || !bytes.Equal(got, data[:testChunk]) {
		t.Fatalf("read after two failed fetches: %v", err)
	}
	if s := stats.snapshot(); s.FetchFailures != 2 || s.ChunksFetched != 1 {
		t.Errorf("stats %+v, want 2 failures then 1 fetch", s)
	}
	if !lb.contains("nats: timeout") {
		t.Errorf("the failed tries were not logged:\n%s", lb)
	}
	src = &flakySource{Source: st, fails: 1 << 30}
	b, _, lb = openBlob(t, t.TempDir(), idx, src, 300*time.Millisecond)
	start := time.Now()
	_, err = readBlob(context.Background(), b, testChunk, 10)
	testenv.WantError(t, err, errdefs.DeadlineExceeded, api.CodeChunkFetchTimeout)
	if !lb.contains("nats: timeout") {
		t.Errorf("the failed tries were not logged:\n%s", lb)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a store that keeps failing held the read %v past a 300 ms deadline", d)
	}
}

// TestBlobFetchTimeout: a fetch that outlives its deadline fails the read
// by the deadline, whether the source honours cancellation or not.
func TestBlobFetchTimeout(t *testing.T) {
	data := testenv.RandBytes(13, testChunk)
	_, idx := storeBlob(t, data, testChunk)
	const timeout = 300 * time.Millisecond
	deaf := deafSource{release: make(chan struct{})}
	for _, tc := range []struct {
		name string
		src  Source
	}{
		{"honours cancellation", stallSource{calls: make(chan struct{}, 1)}},
		{"ignores cancellation", deaf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, stats, _ := openBlob(t, t.TempDir(), idx, tc.src, timeout)
			t.Cleanup(func() {
				if tc.src == Source(deaf) {
					close(deaf.release) // before the blob's close waits for the fetch
				}
			})
			start := time.Now()
			_, err := readBlob(context.Background(), b, 0, 10)
			testenv.WantError(t, err, errdefs.DeadlineExceeded, api.CodeChunkFetchTimeout)
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("the read failed after %v, want about %v", d, timeout)
			}
			if _, ok := tc.src.(stallSource); ok {
				testenv.Eventually(t, 10*time.Second, "the failed fetch to be counted", func() bool {
					return stats.snapshot().FetchFailures == 1
				})
			}
		})
	}
}

func TestBlobContextEnds(t *testing.T) {
	_, idx := storeBlob(t, testenv.RandBytes(14, testChunk), testChunk)
	// The fetch goes on for the other readers it may have; the blob's
	// close waits for it to time out.
	b, _, _ := openBlob(t, t.TempDir(), idx, stallSource{calls: make(chan struct{}, 1)}, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := readBlob(ctx, b, 0, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read with an ended context: %v", err)
	}
}

// TestCacheReuse: a reopened cache serves what an earlier one marked,
// checks it first, and fetches again what was written but not marked or
// no longer matches.
func TestCacheReuse(t *testing.T) {
	data := testenv.RandBytes(15, 4*testChunk)
	st, idx := storeBlob(t, data, testChunk)
	dir := t.TempDir()
	ctx := context.Background()

	cache, err := openCache(dir, idx)
	if err != nil {
		t.Fatal(err)
	}
	b := newBlob(idx, st, cache, &counters{}, slogDiscard(), time.Second)
	for _, off := range []int64{0, testChunk, 2 * testChunk} {
		if _, err := readBlob(ctx, b, off, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	// A crash after chunk 3 was written but before it was marked; and
	// chunk 1 damaged on disk.
	f, err := os.OpenFile(filepath.Join(dir, idx.Hex()+".data"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data[3*testChunk:], 3*testChunk); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("damage"), testChunk+7); err != nil {
		t.Fatal(err)
	}
	f.Close()

	src := countReads(st)
	b2, stats, lb := openBlob(t, dir, idx, src, time.Second)
	want := []chunkState{chunkMarked, chunkMarked, chunkMarked, chunkAbsent}
	for i, w := range want {
		if got := b2.cache.chunk(i); got != w {
			t.Errorf("chunk %d reopened as %d, want %d", i, got, w)
		}
	}
	got, err := readBlob(ctx, b2, 0, int64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read of the reopened blob: %v", err)
	}
	offs, total := src.reads()
	if total != 2 || offs[testChunk] != 1 || offs[3*testChunk] != 1 {
		t.Errorf("fetched %v, want chunks 1 (damaged) and 3 (not marked) once each", offs)
	}
	if s := stats.snapshot(); s.ChunksFetched != 2 || s.CacheHits < 2 {
		t.Errorf("stats %+v", s)
	}
	if !lb.contains("a cached chunk does not match its digest") {
		t.Errorf("the damaged chunk was not logged:\n%s", lb)
	}
}

// TestCacheStartsAfresh: a bitmap that is not the index's, or missing,
// empties the cache.
func TestCacheStartsAfresh(t *testing.T) {
	data := testenv.RandBytes(16, 2*8192)
	st, idx := storeBlob(t, data, testChunk)
	dir := t.TempDir()
	cache, err := openCache(dir, idx)
	if err != nil {
		t.Fatal(err)
	}
	b := newBlob(idx, st, cache, &counters{}, slogDiscard(), time.Second)
	if _, err := readBlob(context.Background(), b, 0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	other := idx
	other.ChunkSize = 8192
	other.Chunks = []string{chunks.Digest(data[:8192]), chunks.Digest(data[8192:])}
	for _, tc := range []struct {
		name   string
		idx    chunks.Index
		remove string
	}{
		{"another chunk size", other, ""},
		{"no bitmap", idx, ".bitmap"},
		{"no data file", idx, ".data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.remove != "" {
				// Fill the cache under idx first.
				c, err := openCache(dir, idx)
				if err != nil {
					t.Fatal(err)
				}
				b := newBlob(idx, st, c, &counters{}, slogDiscard(), time.Second)
				if _, err := readBlob(context.Background(), b, 0, int64(len(data))); err != nil {
					t.Fatal(err)
				}
				b.close()
				if err := os.Remove(filepath.Join(dir, idx.Hex()+tc.remove)); err != nil {
					t.Fatal(err)
				}
			}
			c, err := openCache(dir, tc.idx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			for i := range c.state {
				if c.chunk(i) != chunkAbsent {
					t.Errorf("chunk %d is %d after a fresh start", i, c.chunk(i))
				}
			}
			fi, err := os.Stat(filepath.Join(dir, idx.Hex()+".data"))
			if err != nil || fi.Size() != int64(len(data)) {
				t.Errorf("data file: %v, %v", fi, err)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Options
	}{
		{"no dir", Options{CacheDir: "/c"}},
		{"no cache dir", Options{Dir: "/d"}},
		{"cache in the mount", Options{Dir: "/d", CacheDir: "/d/cache"}},
		{"cache is the mount", Options{Dir: "/d", CacheDir: "/d/"}},
		{"negative timeout", Options{Dir: "/d", CacheDir: "/c", FetchTimeout: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.opt.withDefaults()
			testenv.WantError(t, err, errdefs.Invalid, api.CodeInvalidOptions)
		})
	}
	o, err := Options{Dir: "/d", CacheDir: "/dc"}.withDefaults()
	if err != nil || o.FetchTimeout != DefaultFetchTimeout || o.Logger == nil {
		t.Errorf("defaults: %+v, %v", o, err)
	}
}
