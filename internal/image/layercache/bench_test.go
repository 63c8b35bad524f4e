package layercache

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
)

// percentile returns the p-th percentile (0..100) of ds in microseconds.
func percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return float64(s[i].Nanoseconds()) / 1e3
}

func mean(ds []time.Duration) float64 {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Nanoseconds()) / 1e3 / float64(max(len(ds), 1))
}

// BenchmarkMountLayer mounts and unmounts one cached layer: through the
// cache (View of one layer, then release and GC) and with the bare
// system calls.
func BenchmarkMountLayer(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": random(20, 4<<20), "b/c": "small"})
	c := e.open(Options{})
	defer c.Close(ctx)
	_, release, err := c.View(ctx, []Layer{l}) // fetch and verify once
	if err != nil {
		b.Fatal(err)
	}
	release()
	if err := c.GC(ctx); err != nil {
		b.Fatal(err)
	}

	b.Run("cache", func(b *testing.B) {
		var mounts, unmounts []time.Duration
		for b.Loop() {
			t0 := time.Now()
			_, release, err := c.View(ctx, []Layer{l})
			t1 := time.Now()
			if err != nil {
				b.Fatal(err)
			}
			release()
			t2 := time.Now()
			if err := c.GC(ctx); err != nil {
				b.Fatal(err)
			}
			mounts, unmounts = append(mounts, t1.Sub(t0)), append(unmounts, time.Since(t2))
		}
		b.ReportMetric(mean(mounts), "mount-µs")
		b.ReportMetric(percentile(mounts, 50), "mount-p50-µs")
		b.ReportMetric(mean(unmounts), "unmount-µs")
		b.ReportMetric(percentile(unmounts, 50), "unmount-p50-µs")
	})
	b.Run("syscalls", func(b *testing.B) {
		files := filepath.Join(e.dir, "files", hexOf(l))
		target := filepath.Join(e.root, "raw")
		if err := os.MkdirAll(target, 0o755); err != nil {
			b.Fatal(err)
		}
		var mounts, unmounts []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if err := sys.MountErofs(filepath.Join(files, layer.MetaFile), filepath.Join(files, layer.BlobFile), target); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := sys.Unmount(target); err != nil {
				b.Fatal(err)
			}
			mounts, unmounts = append(mounts, t1.Sub(t0)), append(unmounts, time.Since(t1))
		}
		b.ReportMetric(mean(mounts), "mount-µs")
		b.ReportMetric(percentile(mounts, 50), "mount-p50-µs")
		b.ReportMetric(mean(unmounts), "unmount-µs")
		b.ReportMetric(percentile(unmounts, 50), "unmount-p50-µs")
	})
}

// BenchmarkRootAssembly times Root for a new sandbox over a 3-layer image
// whose layers are mounted already: directories plus one overlay mount.
// Upper directories live on a tmpfs, as a sandbox's would.
func BenchmarkRootAssembly(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	layers := e.threeLayers()
	c := e.open(Options{})
	defer c.Close(ctx)
	_, releaseView, err := c.View(ctx, layers) // keeps the layers mounted
	if err != nil {
		b.Fatal(err)
	}
	defer releaseView()
	uppers := filepath.Join(e.root, "uppers")
	os.Mkdir(uppers, 0o755)
	if err := sys.MountTmpfs("layercache-bench", uppers, "size=64m"); err != nil {
		b.Fatal(err)
	}
	defer sys.Unmount(uppers)

	var roots, releases []time.Duration
	n := 0
	for b.Loop() {
		n++
		u := filepath.Join(uppers, strconv.Itoa(n))
		if err := os.Mkdir(u, 0o755); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		_, release, err := c.Root(ctx, "sb-"+strconv.Itoa(n), layers, u)
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		release()
		roots, releases = append(roots, t1.Sub(t0)), append(releases, time.Since(t1))
		os.RemoveAll(u)
	}
	b.ReportMetric(percentile(roots, 50), "p50-µs")
	b.ReportMetric(percentile(roots, 99), "p99-µs")
	b.ReportMetric(percentile(releases, 50), "release-p50-µs")
	b.ReportMetric(percentile(releases, 99), "release-p99-µs")
	releaseView()
	if err := c.GC(ctx); err != nil {
		b.Fatal(err)
	}
}

// meminfoCached returns Cached: of /proc/meminfo in bytes.
func meminfoCached(tb testing.TB) int64 {
	tb.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Cached:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no Cached: in /proc/meminfo")
	return 0
}

// dropCaches writes dirty pages back and drops the clean page cache.
func dropCaches(tb testing.TB) {
	tb.Helper()
	if out, err := exec.Command("sync").CombinedOutput(); err != nil {
		tb.Fatalf("sync: %v %s", err, out)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		tb.Fatalf("dropping caches: %v", err)
	}
}

// readAll reads the file at p to the end.
func readAll(tb testing.TB, p string) {
	tb.Helper()
	f, err := os.Open(p)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil {
		tb.Fatal(err)
	}
}

const mib = 1 << 20

// BenchmarkPageCacheShared reads a 64 MiB file through 50 sandbox roots
// stacked on the cache's one mount of its layer, and then through 50
// separate EROFS mounts of the same image, from a dropped page cache each
// time, and reports the growth of Cached: and the page-cache pages of the
// backing blob and of the file inside each EROFS mount. Run it once:
// -benchtime=1x.
func BenchmarkPageCacheShared(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	const size, n = 64 * mib, 50
	l := e.layer(map[string]string{"big": random(30, size)})
	c := e.open(Options{})
	defer c.Close(ctx)
	files := filepath.Join(e.dir, "files", hexOf(l))
	meta, blob := filepath.Join(files, layer.MetaFile), filepath.Join(files, layer.BlobFile)
	uppers := filepath.Join(e.root, "uppers")
	os.Mkdir(uppers, 0o755)
	if err := sys.MountTmpfs("layercache-bench", uppers, "size=64m"); err != nil {
		b.Fatal(err)
	}
	defer sys.Unmount(uppers)

	for b.Loop() {
		// Shared: one erofs mount, n overlays.
		var dirs []string
		var releases []func()
		for i := range n {
			u := filepath.Join(uppers, strconv.Itoa(i))
			os.Mkdir(u, 0o755)
			dir, release, err := c.Root(ctx, fmt.Sprint("sb-", i), []Layer{l}, u)
			if err != nil {
				b.Fatal(err)
			}
			dirs, releases = append(dirs, dir), append(releases, release)
		}
		dropCaches(b)
		before := meminfoCached(b)
		t0 := time.Now()
		for _, d := range dirs {
			readAll(b, filepath.Join(d, "big"))
		}
		sharedTime := time.Since(t0)
		shared := meminfoCached(b) - before
		backing, _ := sys.ResidentBytes(blob)
		// Through the layer's mount: a file opened through an overlay has
		// its own (empty) mapping.
		inner, _ := sys.ResidentBytes(filepath.Join(e.dir, "mnt", hexOf(l), "big"))
		for _, r := range releases {
			r()
		}
		if err := c.GC(ctx); err != nil {
			b.Fatal(err)
		}

		// Contrast: n separate erofs mounts of the same files.
		var targets []string
		for i := range n {
			t := filepath.Join(e.root, fmt.Sprint("sep-", i))
			os.Mkdir(t, 0o755)
			if err := sys.MountErofs(meta, blob, t); err != nil {
				b.Fatal(err)
			}
			targets = append(targets, t)
		}
		dropCaches(b)
		before = meminfoCached(b)
		t0 = time.Now()
		for _, t := range targets {
			readAll(b, filepath.Join(t, "big"))
		}
		sepTime := time.Since(t0)
		sep := meminfoCached(b) - before
		sepBacking, _ := sys.ResidentBytes(blob)
		var sepInner int64
		for _, t := range targets {
			r, _ := sys.ResidentBytes(filepath.Join(t, "big"))
			sepInner += r
		}
		for _, t := range targets {
			if err := sys.Unmount(t); err != nil {
				b.Fatal(err)
			}
		}

		// Cached: is system-wide (other processes add noise); the per-file
		// counts (cachestat of the blob and of the file in each EROFS
		// mount) are exact.
		b.ReportMetric(float64(shared)/mib, "cached-MiB-for-50")
		b.ReportMetric(float64(backing+inner)/size, "copies")
		b.ReportMetric(float64(backing)/mib, "backing-MiB")
		b.ReportMetric(float64(inner)/mib, "erofs-MiB")
		b.ReportMetric(float64(sep)/mib, "separate-cached-MiB-for-50")
		b.ReportMetric(float64(sepBacking+sepInner)/size, "separate-copies")
		b.ReportMetric(float64(sepBacking)/mib, "separate-backing-MiB")
		b.ReportMetric(float64(sepInner)/mib, "separate-erofs-MiB")
		b.ReportMetric(float64(sep)/float64(max(shared, 1)), "cached-ratio")
		b.Logf("shared: +%d MiB in %v (backing %d MiB, erofs %d MiB); separate: +%d MiB in %v (backing %d MiB, erofs total %d MiB)",
			shared/mib, sharedTime.Round(time.Millisecond), backing/mib, inner/mib,
			sep/mib, sepTime.Round(time.Millisecond), sepBacking/mib, sepInner/mib)
	}
}
