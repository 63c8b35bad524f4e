package lazyblob

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// readRangeWithin reads n bytes at off of the file at p, waiting at most
// 30 s.
func readRangeWithin(t testing.TB, p string, off, n int64) []byte {
	t.Helper()
	b, err := within(t, p, 30*time.Second, func() ([]byte, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		b := make([]byte, n)
		_, err = f.ReadAt(b, off)
		return b, err
	})
	if err != nil {
		t.Fatalf("reading %s at %d: %v", p, off, err)
	}
	return b
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// diskBytes is the data file's size on disk.
func diskBytes(t testing.TB, s *Server, idx chunks.Index) int64 {
	t.Helper()
	return allocated(filepath.Join(s.cacheDir, idx.Hex()+".data"))
}

// TestCacheEviction: with a budget, reading a blob bigger than it keeps
// the cache near the budget by evicting the least recently used clean
// chunks, every read still returns the right bytes, and an evicted chunk
// is fetched again; a blob whose every chunk is cached is never evicted,
// and once no longer served its files go first.
func TestCacheEviction(t *testing.T) {
	requireHost(t)
	root := t.TempDir()
	const chunk = chunks.DefaultSize
	big := randomBytes(1, 8*chunk)
	small := randomBytes(2, 2*chunk)
	st, bigIdx := storeBlob(t, big, chunk)
	smallIdx := storeFile(t, st, writeTemp(t, small))
	counted := countReads(st)
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache"), MaxCacheBytes: 4 * chunk})
	ctx := context.Background()

	// A whole small blob first: 2 chunks, complete.
	sp, err := s.Add(ctx, smallIdx, counted)
	if err != nil {
		t.Fatal(err)
	}
	if got := readRangeWithin(t, sp, 0, int64(len(small))); !bytes.Equal(got, small) {
		t.Fatal("the small blob read back wrong")
	}
	// The big one, a chunk at a time, paused so that each is synced (and
	// so clean) by the next one's store.
	bp, err := s.Add(ctx, bigIdx, counted)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		time.Sleep(150 * time.Millisecond)
		if got := readRangeWithin(t, bp, int64(i*chunk), chunk); !bytes.Equal(got, big[i*chunk:(i+1)*chunk]) {
			t.Fatalf("chunk %d of the big blob read back wrong", i)
		}
	}
	stats := s.Stats()
	t.Logf("after reading both: %+v; on disk: big %d, small %d", stats, diskBytes(t, s, bigIdx), diskBytes(t, s, smallIdx))
	if stats.ChunksEvicted < 4 {
		t.Errorf("%d chunks evicted, want at least 4 (10 MiB read into a 4 MiB cache)", stats.ChunksEvicted)
	}
	// Within the budget, but for the last chunk (not synced yet, so not
	// clean), by the counter and on disk.
	if stats.CacheBytes > 5*chunk || diskBytes(t, s, bigIdx)+diskBytes(t, s, smallIdx) > 5*chunk {
		t.Errorf("the cache holds %d bytes (%d + %d on disk), budget %d", stats.CacheBytes, diskBytes(t, s, bigIdx), diskBytes(t, s, smallIdx), 4*chunk)
	}
	if _, ok := s.CompleteFile(smallIdx.Digest); !ok {
		t.Error("the complete small blob lost chunks to eviction")
	}
	// The least recently used chunk, 0, went first: reading it fetches it
	// again, right.
	fetched := stats.ChunksFetched
	if got := readRangeWithin(t, bp, 0, chunk); !bytes.Equal(got, big[:chunk]) {
		t.Fatal("an evicted chunk read back wrong")
	}
	if s.Stats().ChunksFetched != fetched+1 {
		t.Errorf("reading evicted chunk 0 fetched %d chunks, want 1", s.Stats().ChunksFetched-fetched)
	}

	// No longer served: the small blob's files go before any chunk.
	if err := s.Remove(ctx, smallIdx.Digest); err != nil {
		t.Fatal(err)
	}
	evicted := s.Stats().ChunksEvicted
	for i := 1; i < 3; i++ {
		time.Sleep(150 * time.Millisecond)
		readRangeWithin(t, bp, int64(i*chunk), chunk)
	}
	if st := s.Stats(); st.FilesEvicted != 1 {
		t.Errorf("%d files evicted after the small blob was removed, want 1 (%+v)", st.FilesEvicted, st)
	}
	if _, err := os.Stat(filepath.Join(s.cacheDir, smallIdx.Hex()+".data")); !os.IsNotExist(err) {
		t.Errorf("the removed blob's data file: %v, want it gone", err)
	}
	t.Logf("chunks evicted while the removed blob's files went: %d", s.Stats().ChunksEvicted-evicted)
	if f, err := os.Open(filepath.Join(s.cacheDir, bigIdx.Hex()+".data")); err == nil {
		if n, err := sys.Allocated(f); err != nil || n > 5*chunk {
			t.Errorf("the big blob's data file holds %d bytes on disk (%v)", n, err)
		}
		f.Close()
	}
}

// writeTemp writes b to a temporary file and returns its path.
func writeTemp(t testing.TB, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEvictionUnderReads: readers reading ranges of a blob four times
// the cache's budget, all at once for a few seconds, while eviction
// keeps taking chunks, get the right bytes every time (a chunk being
// read from the cache file is never evicted under it). Its last chunks
// are never read, so the blob never becomes whole (which would stop
// eviction).
func TestEvictionUnderReads(t *testing.T) {
	requireHost(t)
	root := t.TempDir()
	const chunk = chunks.DefaultSize
	data := randomBytes(3, 10*chunk)
	readable := int64(8 * chunk)
	st, idx := storeBlob(t, data, chunk)
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache"), MaxCacheBytes: 2 * chunk})
	p, err := s.Add(context.Background(), idx, st)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			errs <- func() error {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				defer f.Close()
				r := rand.New(rand.NewPCG(uint64(g), 7))
				for time.Now().Before(deadline) {
					off := r.Int64N(readable - 1)
					n := min(1+r.Int64N(2*chunk), readable-off)
					got := make([]byte, n)
					if _, err := f.ReadAt(got, off); err != nil {
						return fmt.Errorf("reader %d: %d bytes at %d: %w", g, n, off, err)
					}
					if !bytes.Equal(got, data[off:off+n]) {
						return fmt.Errorf("reader %d: %d bytes at %d read back wrong", g, n, off)
					}
				}
				return nil
			}()
		}()
	}
	for range 4 {
		if err := testenv.Recv(t, errs, time.Minute, "a reader"); err != nil {
			t.Error(err)
		}
	}
	stats := s.Stats()
	t.Logf("%+v", stats)
	if stats.ChunksEvicted < 5 {
		t.Errorf("%d chunks evicted: the readers hardly raced eviction", stats.ChunksEvicted)
	}
}
