package layercache

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.SweepStale(time.Hour)
	os.Exit(m.Run())
}

// env is one test's world: a local blob store and a cache directory.
type env struct {
	t        testing.TB
	root     string // everything of the test lives below
	dir      string // the cache directory
	store    *blobstore.Local
	mkfs     string
	building sync.Mutex
}

// newEnv skips unless the test can mount EROFS (root, mkfs.erofs), and
// checks at the end that nothing is left mounted and no goroutine leaked.
// Mounts that are left are reported and then detached, so a failing test
// does not leak them to the host.
func newEnv(t testing.TB) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting EROFS and overlay needs root")
	}
	bin, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		t.Skipf("could not find mkfs.erofs (Debian erofs-utils): %v", err)
	}
	root := t.TempDir()
	store, err := blobstore.NewLocal(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, root: root, dir: filepath.Join(root, "layers"), store: store, mkfs: bin}
	goroutines := testenv.Goroutines()
	t.Cleanup(func() {
		left := testenv.Mounts(t, root)
		if len(left) > 0 {
			t.Errorf("leftover mounts under %s: %q", root, left)
			sort.Slice(left, func(i, j int) bool { return len(left[i]) > len(left[j]) })
			for _, m := range left {
				_ = sys.DetachMount(m)
			}
		}
		testenv.GoroutinesSettle(t, goroutines)
	})
	return e
}

// open opens a cache on e.dir; the test must Close it.
func (e *env) open(opt Options) *Cache {
	e.t.Helper()
	if opt.Dir == "" {
		opt.Dir = e.dir
	}
	if opt.Store == nil {
		opt.Store = e.store
	}
	c, err := New(context.Background(), opt)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return c
}

// layer builds a layer from files (path → content) with mkfs.erofs, puts
// its meta and blob files in the store and returns it with a manifest
// that has their real digests.
func (e *env) layer(files map[string]string) Layer {
	e.t.Helper()
	src, err := os.MkdirTemp(e.root, "src-")
	if err != nil {
		e.t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			e.t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	out, err := os.MkdirTemp(e.root, "build-")
	if err != nil {
		e.t.Fatal(err)
	}
	meta, blob := filepath.Join(out, layer.MetaFile), filepath.Join(out, layer.BlobFile)
	if b, err := exec.Command(e.mkfs, "--quiet", "-T0", "--chunksize=1048576", "--blobdev="+blob, meta, src).CombinedOutput(); err != nil {
		e.t.Fatalf("mkfs.erofs: %v\n%s", err, b)
	}
	m := layer.Manifest{
		MediaType: layer.MediaType,
		Version:   1,
		Meta:      e.put(meta),
		Blob:      e.put(blob),
		ChunkSize: layer.ChunkSize,
		Source:    layer.Source{Kind: layer.SourceDir, Digest: layer.Digest([]byte(src))},
		Builder:   layer.Builder{Name: "mkfs.erofs", Version: "1.5", Options: []string{"-T0", "--chunksize=1048576", "--blobdev"}},
	}
	if err := m.Validate(); err != nil {
		e.t.Fatal(err)
	}
	return Layer{ID: m.ID(), Manifest: m}
}

// put stores the file at p and returns its reference.
func (e *env) put(p string) layer.FileRef {
	e.t.Helper()
	f, err := os.Open(p)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		e.t.Fatal(err)
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, 0); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.store.Put(context.Background(), d, f); err != nil {
		e.t.Fatal(err)
	}
	return layer.FileRef{Digest: d, Size: n}
}

// random returns n pseudo-random bytes (incompressible, no duplicate
// chunks), fixed by seed.
func random(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return string(b)
}

// threeLayers returns a base/workspace/toolkit image (bottom first) with
// overlapping paths.
func (e *env) threeLayers() []Layer {
	base := e.layer(map[string]string{
		"etc/os-release": "ID=base\n",
		"shared.txt":     "from base",
		"dir/a":          "base a",
		"bin/tool":       "base tool",
	})
	ws := e.layer(map[string]string{
		"shared.txt":    "from workspace",
		"dir/b":         "workspace b",
		"work/data.bin": random(1, 3<<20+123), // spans several chunks
	})
	tk := e.layer(map[string]string{
		"shared.txt": "from toolkit",
		"dir/a":      "toolkit a",
		"tools/go":   "toolkit go",
	})
	return []Layer{base, ws, tk}
}

// wantThree is what a view of threeLayers shows.
var wantThree = map[string]string{
	"etc/os-release": "ID=base\n",
	"shared.txt":     "from toolkit",
	"dir/a":          "toolkit a",
	"dir/b":          "workspace b",
	"bin/tool":       "base tool",
	"tools/go":       "toolkit go",
	"work/data.bin":  random(1, 3<<20+123),
}

// checkFiles fails the test unless dir shows want.
func checkFiles(t testing.TB, dir string, want map[string]string) {
	t.Helper()
	for p, w := range want {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Errorf("reading %s in %s: %v", p, dir, err)
			continue
		}
		if string(b) != w {
			t.Errorf("%s in %s: %d bytes %.20q, want %d bytes %.20q", p, dir, len(b), b, len(w), w)
		}
	}
}

// mountsByType counts the mounts at or below dir by file system type,
// leaving out the cache's own tmpfs under views/ and roots/ (they hold
// mount points, not layers).
func mountsByType(t testing.TB, dir string) map[string]int {
	t.Helper()
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 2 && (fields[1] == dir || strings.HasPrefix(fields[1], dir+"/")) {
			if fields[0] == "dsec-layers" && fields[2] == "tmpfs" {
				continue
			}
			out[fields[2]]++
		}
	}
	return out
}

// countingStore counts Open calls per digest and can corrupt, delay or
// block them. It hides blobstore.Local's Path, so the cache copies.
type countingStore struct {
	blobstore.Store
	mu      sync.Mutex
	opens   map[string]int
	delay   time.Duration
	corrupt bool
	// blockFirst makes the first Open wait for its context to end.
	blockFirst atomic.Bool
	blocked    chan struct{} // closed when the first Open is blocking
}

func newCountingStore(s blobstore.Store) *countingStore {
	return &countingStore{Store: s, opens: map[string]int{}, blocked: make(chan struct{})}
}

func (s *countingStore) Open(ctx context.Context, digest string) (io.ReadCloser, blobstore.Info, error) {
	s.mu.Lock()
	s.opens[digest]++
	s.mu.Unlock()
	if s.blockFirst.CompareAndSwap(true, false) {
		close(s.blocked)
		// bounded: the fake store blocks until its caller's context ends
		<-ctx.Done()
		return nil, blobstore.Info{}, ctx.Err()
	}
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	rc, info, err := s.Store.Open(ctx, digest)
	if err != nil || !s.corrupt {
		return rc, info, err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, info, err
	}
	b[len(b)/2] ^= 0xff
	return io.NopCloser(strings.NewReader(string(b))), info, nil
}

func (s *countingStore) openCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.opens))
	for k, v := range s.opens {
		out[k] = v
	}
	return out
}

// dirEntries lists a directory's names (nil if it does not exist).
func dirEntries(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func hexOf(l Layer) string { return strings.TrimPrefix(l.ID, "sha256:") }
