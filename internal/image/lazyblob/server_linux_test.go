package lazyblob

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestLazyLayer mounts a layer whose blob is served on demand next to
// the same layer mounted from its local blob: the two trees are the
// same, a small read fetches only a few chunks, and a whole walk fetches
// each chunk at most once.
func TestLazyLayer(t *testing.T) {
	root, _, l := treeLayer(t)
	chunks := len(l.idx.Chunks)
	if chunks < 8 {
		t.Fatalf("the blob has %d chunks; the test wants a few more", chunks)
	}

	eager := mkdir(t, root, "eager")
	mountErofs(t, l.meta, l.blob, eager)
	counted := countReads(l.store)
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache")})
	p, err := s.Add(context.Background(), l.idx, counted)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(s.Dir(), l.idx.Digest[7:]); p != want {
		t.Errorf("Add returned %s, want %s", p, want)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != l.idx.Size || fi.Mode() != 0o444 {
		t.Fatalf("the blob file: %v, %v", fi, err)
	}
	lazy := mkdir(t, root, "lazy")
	mountErofs(t, l.meta, p, lazy)
	t.Logf("blob of %d bytes in %d chunks; after the mount: %+v", l.idx.Size, chunks, s.Stats())

	// One small file.
	want, err := os.ReadFile(filepath.Join(eager, "a/b/f005"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := readWithin(t, filepath.Join(lazy, "a/b/f005"), 30*time.Second)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("small file through the lazy layer: %d bytes, %v; want %d bytes", len(got), err, len(want))
	}
	st := s.Stats()
	t.Logf("after one small file: %+v", st)
	if st.ChunksFetched < 1 || st.ChunksFetched > 2 {
		t.Errorf("a small read fetched %d of %d chunks, want 1 or 2", st.ChunksFetched, chunks)
	}

	// Everything.
	wantTree, gotTree := snapshot(t, eager), snapshot(t, lazy)
	if d := cmp.Diff(wantTree, gotTree); d != "" {
		t.Errorf("the lazy tree differs from the eager one (-eager +lazy):\n%s", d)
	}
	if len(gotTree) < 130 {
		t.Errorf("the tree has %d entries, want the ~135 written", len(gotTree))
	}
	offs, total := counted.reads()
	for off, n := range offs {
		if n > 1 {
			t.Errorf("the chunk at %d was fetched %d times", off, n)
		}
	}
	st = s.Stats()
	t.Logf("after the walk: %+v (%d chunks read from the store)", st, total)
	if st.ChunksFetched != int64(total) || st.ChunksFetched > int64(chunks) || st.FetchFailures != 0 {
		t.Errorf("stats %+v after %d store reads of %d chunks", st, total, chunks)
	}
	if st.BytesFetched > l.idx.Size {
		t.Errorf("fetched %d bytes of a %d-byte blob", st.BytesFetched, l.idx.Size)
	}
	// Mapped (as a program's text is), a file reads the same.
	checkMapped(t, filepath.Join(lazy, "big/one-and-a-half"), testenv.RandBytes(2, 3<<19))
}

// checkMapped maps the file at p and compares its bytes with want, in a
// child process (mappedRole says why).
func checkMapped(t *testing.T, p string, want []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum := sha256.Sum256(want)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mappedEnv+"="+p, mappedEnv+"_SHA256="+hex.EncodeToString(sum[:]), mappedEnv+"_LEN="+strconv.Itoa(len(want)))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("%s mapped is not its content: %v: %s", p, err, out)
	}
}

// TestCorruptChunk: a chunk whose bytes in the store are not its index's
// fails the reads that need it with EIO, every time, and never reaches a
// reader; the rest of the layer reads fine.
func TestCorruptChunk(t *testing.T) {
	root, _, l := treeLayer(t)
	const bad = 2
	off, n := l.idx.Range(bad)
	corruptStored(t, l.store, l.idx.Digest, off+n/2, 4096)

	eager := mkdir(t, root, "eager")
	mountErofs(t, l.meta, l.blob, eager)
	log, lb := newLog()
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache"), Logger: log})
	p, err := s.Add(context.Background(), l.idx, l.store)
	if err != nil {
		t.Fatal(err)
	}
	lazy := mkdir(t, root, "lazy")
	mountErofs(t, l.meta, p, lazy)

	var failed, ok []string
	for rel, e := range snapshot(t, eager) {
		if e.Type != "f" || e.Size == 0 {
			continue
		}
		want, err := os.ReadFile(filepath.Join(eager, rel))
		if err != nil {
			t.Fatal(err)
		}
		got, err := readWithin(t, filepath.Join(lazy, rel), 30*time.Second)
		switch {
		case err != nil && !errors.Is(err, syscall.EIO):
			t.Errorf("%s: %v, want EIO", rel, err)
		case err != nil:
			failed = append(failed, rel)
		case !bytes.Equal(got, want):
			t.Errorf("%s: read %d bytes that are not the file's", rel, len(got))
		default:
			ok = append(ok, rel)
		}
	}
	sort.Strings(failed)
	t.Logf("%d files failed with EIO (%q), %d read whole", len(failed), failed, len(ok))
	if len(failed) == 0 || len(ok) < 100 {
		t.Errorf("%d files failed and %d read; want some of each", len(failed), len(ok))
	}
	// Again: the bad chunk was not cached, and is fetched (and refused)
	// again.
	before := s.Stats().ChunksCorrupt
	if _, err := readWithin(t, filepath.Join(lazy, failed[0]), 30*time.Second); !errors.Is(err, syscall.EIO) {
		t.Errorf("reading %s again: %v, want EIO", failed[0], err)
	}
	st := s.Stats()
	if st.ChunksCorrupt <= before || st.FetchFailures != st.ChunksCorrupt {
		t.Errorf("stats %+v (corrupt before the second read: %d)", st, before)
	}
	if !lb.contains("level=WARN") || !lb.contains("does not match its digest") {
		t.Errorf("no warning about the chunk:\n%s", lb)
	}
}

// TestStalledSource: a store that stops answering fails the read with
// EIO once the fetch timeout passes; the reader does not hang.
func TestStalledSource(t *testing.T) {
	root, _, l := treeLayer(t)
	stall := stallSource{calls: make(chan struct{}, 1)}
	const timeout = 300 * time.Millisecond
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache"), FetchTimeout: timeout})
	p, err := s.Add(context.Background(), l.idx, stall)
	if err != nil {
		t.Fatal(err)
	}
	lazy := mkdir(t, root, "lazy")
	mountErofs(t, l.meta, p, lazy)
	start := time.Now()
	_, err = readWithin(t, filepath.Join(lazy, "big/three-and-a-bit"), 30*time.Second)
	elapsed := time.Since(start)
	t.Logf("the read failed after %v: %v", elapsed, err)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("read through a stalled store: %v, want EIO", err)
	}
	if elapsed > 10*time.Second {
		t.Errorf("the read took %v with a fetch timeout of %v", elapsed, timeout)
	}
	testenv.Recv(t, stall.calls, time.Second, "the fetch to have reached the store")
	testenv.Eventually(t, 10*time.Second, "the failed fetch to be counted", func() bool {
		return s.Stats().FetchFailures > 0
	})
}

// TestRemountReusesCache: a server mounted again over the same cache
// serves what the first one fetched without fetching it again.
func TestRemountReusesCache(t *testing.T) {
	root, _, l := treeLayer(t)
	cacheDir, blobs, lazy := mkdir(t, root, "cache"), mkdir(t, root, "blobs"), mkdir(t, root, "lazy")
	eager := mkdir(t, root, "eager")
	mountErofs(t, l.meta, l.blob, eager)
	wantTree := snapshot(t, eager)

	s, err := Mount(context.Background(), Options{Dir: blobs, CacheDir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Add(context.Background(), l.idx, l.store)
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.MountErofs(l.meta, p, lazy); err != nil {
		t.Fatal(err)
	}
	snapshot(t, lazy)
	first := s.Stats()
	if err := sys.Unmount(lazy); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m, _ := sys.MountsUnder(blobs); len(m) > 0 {
		t.Fatalf("mounts left after Close: %q", m)
	}

	counted := countReads(l.store)
	s = mountServer(t, Options{Dir: blobs, CacheDir: cacheDir})
	if p, err = s.Add(context.Background(), l.idx, counted); err != nil {
		t.Fatal(err)
	}
	mountErofs(t, l.meta, p, lazy)
	if d := cmp.Diff(wantTree, snapshot(t, lazy)); d != "" {
		t.Errorf("the tree from the reused cache differs (-eager +lazy):\n%s", d)
	}
	st := s.Stats()
	t.Logf("first run %+v; second run %+v", first, st)
	if _, total := counted.reads(); total != 0 || st.ChunksFetched != 0 || st.CacheHits == 0 {
		t.Errorf("the second run read %d ranges from the store; stats %+v", total, st)
	}
}

// TestRemove: a removed blob's name goes at once; an EROFS mount that has
// it open reads on until unmounted, and the blob is then let go.
func TestRemove(t *testing.T) {
	root, _, l := treeLayer(t)
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache")})
	ctx := context.Background()
	p, err := s.Add(ctx, l.idx, l.store)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Add(ctx, l.idx, l.store); err != nil || again != p {
		t.Errorf("adding the blob again: %s, %v; want %s", again, err, p)
	}
	other := l.idx
	other.ChunkSize, other.Chunks = 1<<19, append(slices.Clone(l.idx.Chunks), l.idx.Chunks...)[:chunks.Count(l.idx.Size, 1<<19)]
	_, err = s.Add(ctx, other, l.store)
	testenv.WantError(t, err, errdefs.Conflict, api.CodeLazyBlobExists)

	lazy := mkdir(t, root, "lazy")
	if err := sys.MountErofs(l.meta, p, lazy); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, l.idx.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed blob's file: %v", err)
	}
	if ents, err := os.ReadDir(s.Dir()); err != nil || len(ents) != 0 {
		t.Errorf("the mount lists %v, %v", ents, err)
	}
	if b, err := readWithin(t, filepath.Join(lazy, "big/one-chunk"), 30*time.Second); err != nil || !bytes.Equal(b, testenv.RandBytes(1, 1<<20)) {
		t.Errorf("reading through the mount of the removed blob: %v", err)
	}
	if err := sys.Unmount(lazy); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the removed blob to be let go once closed", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.blobs) == 0
	})
	if err := s.Remove(ctx, l.idx.Digest); err != nil {
		t.Errorf("removing it twice: %v", err)
	}
	err = s.Remove(ctx, "sha256:nothex")
	testenv.WantError(t, err, errdefs.Invalid, api.CodeInvalidDigest)
	// It can come back, with its cache.
	if p, err = s.Add(ctx, l.idx, l.store); err != nil {
		t.Fatal(err)
	}
	mountErofs(t, l.meta, p, lazy)
	if b, err := readWithin(t, filepath.Join(lazy, "big/one-chunk"), 30*time.Second); err != nil || !bytes.Equal(b, testenv.RandBytes(1, 1<<20)) {
		t.Errorf("reading after adding the blob again: %v", err)
	}
}

// TestCloseInUse: Close with an EROFS mount still over a blob file takes
// the FUSE mount away anyway (reads through the EROFS mount then fail)
// and leaves no FUSE mount behind.
func TestCloseInUse(t *testing.T) {
	root, _, l := treeLayer(t)
	log, lb := newLog()
	blobs := mkdir(t, root, "blobs")
	s, err := Mount(context.Background(), Options{Dir: blobs, CacheDir: mkdir(t, root, "cache"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Add(context.Background(), l.idx, l.store)
	if err != nil {
		t.Fatal(err)
	}
	lazy := mkdir(t, root, "lazy")
	mountErofs(t, l.meta, p, lazy)
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	if err := testenv.Recv(t, done, 30*time.Second, "Close with the blob in use"); err != nil {
		t.Errorf("Close: %v", err)
	}
	if !lb.contains("forced off") {
		t.Errorf("no warning of the forced unmount:\n%s", lb)
	}
	if m, _ := sys.MountsUnder(blobs); len(m) > 0 {
		t.Errorf("FUSE mounts left: %q", m)
	}
	if _, err := readWithin(t, filepath.Join(lazy, "big/three-and-a-bit"), 30*time.Second); err == nil {
		t.Error("a read through the EROFS mount of a closed server succeeded")
	}
	_, err = s.Add(context.Background(), l.idx, l.store)
	testenv.WantError(t, err, errdefs.Unavailable, api.CodeLazyBlobsClosed)
}

// TestMountOverDeadMount: a crashed server's dead mount is detached.
func TestMountOverDeadMount(t *testing.T) {
	requireHost(t)
	root := leakCheck(t)
	dir := mkdir(t, root, "blobs")
	conn, err := sys.MountFUSE(dir, "lazyblobtest")
	if err != nil {
		t.Fatal(err)
	}
	conn.Close() // the "crash": the connection is gone, the mount stays
	if _, err := os.Stat(dir); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("the dead mount: stat gives %v, want ENOTCONN", err)
	}
	s := mountServer(t, Options{Dir: dir, CacheDir: mkdir(t, root, "cache")})
	if ents, err := os.ReadDir(s.Dir()); err != nil || len(ents) != 0 {
		t.Errorf("the new mount lists %v, %v", ents, err)
	}
	if m, _ := sys.MountsUnder(dir); len(m) != 1 {
		t.Errorf("mounts at %s: %q, want the server's only", dir, m)
	}
}

// TestCacheDirLocked: two servers cannot share a cache.
func TestCacheDirLocked(t *testing.T) {
	requireHost(t)
	root := leakCheck(t)
	cache := mkdir(t, root, "cache")
	mountServer(t, Options{Dir: mkdir(t, root, "one"), CacheDir: cache})
	_, err := Mount(context.Background(), Options{Dir: mkdir(t, root, "two"), CacheDir: cache})
	testenv.WantError(t, err, errdefs.Conflict, api.CodeLazyCacheLocked)
}

// TestBlobFile reads a blob's file directly, at offsets and sizes that
// straddle chunks and its end, and checks the server's descriptors are
// close-on-exec: a program started with the /dev/fuse connection open
// could answer the kernel in the server's place.
func TestBlobFile(t *testing.T) {
	requireHost(t)
	root := leakCheck(t)
	data := testenv.RandBytes(20, 3<<20+4321)
	st, idx := storeBlob(t, data, 0)
	before := openFDs(t)
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache")})
	p, err := s.Add(context.Background(), idx, st)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, r := range []struct{ off, n int64 }{
		{0, 10}, {1<<20 - 5, 10}, {2<<20 - 1, 1<<20 + 2}, {int64(len(data)) - 7, 7}, {int64(len(data)) - 7, 100}, {int64(len(data)), 10}, {0, int64(len(data))},
	} {
		buf := make([]byte, r.n)
		n, err := f.ReadAt(buf, r.off)
		want := data[min(r.off, int64(len(data))):min(r.off+r.n, int64(len(data)))]
		if (err != nil && !errors.Is(err, io.EOF)) || !bytes.Equal(buf[:n], want) {
			t.Errorf("read %d+%d: %d bytes, %v; want %d bytes", r.off, r.n, n, err, len(want))
		}
	}
	if _, err := os.OpenFile(p, os.O_RDWR, 0); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
		t.Errorf("opening the blob file for writing: %v", err)
	}
	fuseConns := 0
	for fd, target := range openFDs(t) {
		if _, ok := before[fd]; ok {
			continue
		}
		if target == "/dev/fuse" {
			fuseConns++
		}
		if cloexec, err := sys.HasCloseOnExec(fd); err == nil && !cloexec {
			t.Errorf("descriptor %d (%s) is not close-on-exec", fd, target)
		}
	}
	if fuseConns != 1 {
		t.Errorf("%d /dev/fuse descriptors open, want the server's one", fuseConns)
	}
}

// openFDs returns the process's open descriptors and what they are.
func openFDs(t testing.TB) map[int]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			out[fd] = target
		}
	}
	return out
}

// TestCompleteFile: a blob's cache file is handed out as the whole blob
// only once every chunk is in it, checked; after a restart the chunks
// marked by the earlier run are checked first, and a damaged one keeps
// the blob incomplete.
func TestCompleteFile(t *testing.T) {
	requireHost(t)
	root := leakCheck(t)
	data := testenv.RandBytes(21, 3<<20+17)
	st, idx := storeBlob(t, data, 0)
	ctx := context.Background()
	opt := Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache")}
	s, err := Mount(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.CompleteFile(idx.Digest); ok {
		t.Error("a blob not served is complete")
	}
	p, err := s.Add(ctx, idx, st)
	if err != nil {
		t.Fatal(err)
	}
	read := func(off, n int64) {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.ReadAt(make([]byte, n), off); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	read(0, 10)
	if _, ok := s.CompleteFile(idx.Digest); ok {
		t.Error("a blob with one chunk of four fetched is complete")
	}
	read(0, int64(len(data)))
	file, ok := s.CompleteFile(idx.Digest)
	if got, err := os.ReadFile(file); !ok || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the complete blob's file %q (%v): %d bytes, %v", file, ok, len(got), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart: marked chunks are checked before the blob counts as
	// complete; one damaged on disk makes it not.
	s = mountServer(t, opt)
	if _, err := s.Add(ctx, idx, st); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.CompleteFile(idx.Digest); !ok {
		t.Error("after a restart, a blob whose chunks are all marked and sound is not complete")
	}
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^data[5<<19]}, 5<<19); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mountServer(t, opt)
	if _, err := s.Add(ctx, idx, st); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.CompleteFile(idx.Digest); ok {
		t.Error("a blob with a damaged chunk on disk is complete")
	}
}

// TestInterruptedRead: a process reading through a lazily loaded layer
// that gets a signal while its chunk is being fetched reads the data, not
// EIO. (EROFS turns any error of its device into EIO; a FUSE read the
// kernel interrupts must not fail.) The reader is a Python process with
// a SIGUSR1 handler, signalled while the store holds the fetch.
func TestInterruptedRead(t *testing.T) {
	root, src, l := treeLayer(t)
	gate := &gatedSource{src: l.store, open: make(chan struct{}), entered: make(chan struct{}, 64)}
	s := mountServer(t, Options{Dir: mkdir(t, root, "blobs"), CacheDir: mkdir(t, root, "cache")})
	p, err := s.Add(context.Background(), l.idx, gate)
	if err != nil {
		t.Fatal(err)
	}
	lazy := mkdir(t, root, "lazy")
	mountLazyErofs(t, l.meta, p, lazy)
	file := filepath.Join(lazy, "big/three-and-a-bit")
	want, err := os.ReadFile(filepath.Join(src, "big/three-and-a-bit"))
	if err != nil {
		t.Fatal(err)
	}
	script := `import hashlib, signal, sys
signal.signal(signal.SIGUSR1, lambda *a: None)
print("ready", flush=True)
try:
    data = open(sys.argv[1], "rb").read()
except OSError as e:
    print("error", e.errno, flush=True)
    sys.exit(1)
print("read", len(data), hashlib.sha256(data).hexdigest(), flush=True)
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("the reader did not start: %q", lines.Text())
	}
	testenv.Recv(t, gate.entered, 10*time.Second, "the reader's fetch to reach the store")
	for range 5 {
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(gate.open)
	lines.Scan()
	got := lines.Text()
	if err := testenv.WaitCmd(t, cmd, 30*time.Second, "the reader to exit"); err != nil {
		t.Errorf("the reader: %v", err)
	}
	sum := sha256.Sum256(want)
	if wantLine := fmt.Sprintf("read %d %x", len(want), sum); got != wantLine {
		t.Errorf("the interrupted reader printed %q, want %q", got, wantLine)
	}
}
