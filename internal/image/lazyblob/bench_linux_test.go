package lazyblob

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

const benchFileSize = 64 << 20

// benchLayer builds a layer holding one 64 MiB file, "big", and mounts
// it eagerly (from its local blob) at eager.
func benchLayer(b *testing.B, root string) (l testLayer, eager string) {
	b.Helper()
	src := mkdir(b, root, "src")
	if err := os.WriteFile(filepath.Join(src, "big"), testenv.RandBytes(64, benchFileSize), 0o644); err != nil {
		b.Fatal(err)
	}
	l = buildLayer(b, root, src)
	eager = mkdir(b, root, "eager")
	mountErofs(b, l.meta, l.blob, eager)
	return l, eager
}

// evict drops the clean page cache of the files at paths, so that the
// next read of them goes to what is below (FUSE, the blob).
func evict(b *testing.B, paths ...string) {
	b.Helper()
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			b.Fatalf("evicting %s: %v", p, err)
		}
	}
}

// timedRead reads the file at p whole and returns how long it took.
func timedRead(b *testing.B, p string) time.Duration {
	b.Helper()
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	n, err := io.CopyBuffer(io.Discard, f, make([]byte, 1<<20))
	d := time.Since(start)
	if err != nil || n != benchFileSize {
		b.Fatalf("reading %s: %d bytes, %v", p, n, err)
	}
	return d
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / (1 << 20) / d.Seconds() }

// BenchmarkWarmRead reads a 64 MiB file through the lazy layer, every
// chunk of it cached, and through the eager mount of the same layer, in
// turn. Each read starts with the EROFS page cache of the file (and the
// FUSE file's) dropped, so it goes down to the blob: the cache file
// (through FUSE) against the local blob file, both in the page cache.
func BenchmarkWarmRead(b *testing.B) {
	requireHost(b)
	root := b.TempDir()
	l, eager := benchLayer(b, root)
	s := mountServer(b, Options{Dir: mkdir(b, root, "blobs"), CacheDir: mkdir(b, root, "cache")})
	p, err := s.Add(context.Background(), l.idx, l.store)
	if err != nil {
		b.Fatal(err)
	}
	lazy := mkdir(b, root, "lazy")
	mountLazyErofs(b, l.meta, p, lazy)
	lazyFile, eagerFile := filepath.Join(lazy, "big"), filepath.Join(eager, "big")
	timedRead(b, lazyFile) // fetch every chunk
	timedRead(b, eagerFile)
	if st := s.Stats(); st.ChunksFetched != int64(len(l.idx.Chunks)) {
		b.Fatalf("priming fetched %d of %d chunks", st.ChunksFetched, len(l.idx.Chunks))
	}
	var lazyTime, eagerTime time.Duration
	b.SetBytes(2 * benchFileSize)
	b.ResetTimer()
	for range b.N {
		evict(b, lazyFile, p, eagerFile)
		lazyTime += timedRead(b, lazyFile)
		evict(b, eagerFile)
		eagerTime += timedRead(b, eagerFile)
	}
	b.StopTimer()
	total := int64(b.N) * benchFileSize
	lazyMBps, eagerMBps := mbps(total, lazyTime), mbps(total, eagerTime)
	b.ReportMetric(lazyMBps, "lazy-MB/s")
	b.ReportMetric(eagerMBps, "eager-MB/s")
	b.ReportMetric(lazyMBps/eagerMBps, "lazy/eager")
	if st := s.Stats(); st.ChunksFetched != int64(len(l.idx.Chunks)) {
		b.Errorf("warm reads fetched: %+v", st)
	}
}

// BenchmarkColdRead reads a 64 MiB file through a lazy layer with an
// empty cache: every chunk is fetched from a local blob store (whose
// file is in the page cache), checked, written and synced.
func BenchmarkColdRead(b *testing.B) {
	requireHost(b)
	root := b.TempDir()
	l, _ := benchLayer(b, root)
	var cold time.Duration
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		dir := mkdir(b, root, "run"+strconv.Itoa(i))
		s, err := Mount(context.Background(), Options{Dir: mkdir(b, dir, "blobs"), CacheDir: mkdir(b, dir, "cache")})
		if err != nil {
			b.Fatal(err)
		}
		p, err := s.Add(context.Background(), l.idx, l.store)
		if err != nil {
			b.Fatal(err)
		}
		lazy := mkdir(b, dir, "lazy")
		if err := sys.MountErofs(l.meta, p, lazy); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cold += timedRead(b, filepath.Join(lazy, "big"))
		b.StopTimer()
		if err := sys.Unmount(lazy); err != nil {
			b.Fatal(err)
		}
		if st := s.Stats(); st.ChunksFetched != int64(len(l.idx.Chunks)) {
			b.Errorf("a cold read fetched %d of %d chunks", st.ChunksFetched, len(l.idx.Chunks))
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(mbps(int64(b.N)*benchFileSize, cold), "cold-MB/s")
}
