package layercache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// gcAndCheckEmpty releases nothing: it runs GC and checks that no mount
// and no mount point is left under the cache.
func gcAndCheckEmpty(t *testing.T, c *Cache, dir string) {
	t.Helper()
	if err := c.GC(context.Background()); err != nil {
		t.Errorf("GC: %v", err)
	}
	for _, sub := range []string{"files", "mnt", "views", "roots", "tmp"} {
		if m := mountsByType(t, filepath.Join(dir, sub)); len(m) != 0 {
			t.Errorf("mounts left under %s/ after GC: %v", sub, m)
		}
	}
	for _, sub := range []string{"views", "roots", "tmp"} {
		if ents := dirEntries(t, filepath.Join(dir, sub)); len(ents) != 0 {
			t.Errorf("%s/ not empty after GC: %q", sub, ents)
		}
	}
	// Cached layers keep their (empty) mount points; others have none.
	cached := dirEntries(t, filepath.Join(dir, "files"))
	for _, m := range dirEntries(t, filepath.Join(dir, "mnt")) {
		if !slices.Contains(cached, m) {
			t.Errorf("mount point mnt/%s left for a layer that is not cached", m)
		}
	}
	if s := c.Stats(); s.Mounts != 0 || s.Views != 0 || s.Roots != 0 {
		t.Errorf("Stats after GC = %+v", s)
	}
}

func TestRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	c := e.open(Options{})
	defer c.Close(ctx)

	view, releaseView, err := c.View(ctx, layers)
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, view, wantThree)
	if err := os.WriteFile(filepath.Join(view, "x"), nil, 0o644); err == nil {
		t.Error("a view is writable")
	}

	upper := filepath.Join(e.root, "sandbox-1")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	root, releaseRoot, err := c.Root(ctx, "sandbox-1", layers, upper)
	if err != nil {
		t.Fatal(err)
	}
	if root != filepath.Join(e.dir, "roots", "sandbox-1") {
		t.Errorf("root at %s", root)
	}
	checkFiles(t, root, wantThree)
	if err := os.WriteFile(filepath.Join(root, "shared.txt"), []byte("written"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "new.txt"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "dir", "b")); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, filepath.Join(upper, "upper"), map[string]string{"shared.txt": "written", "new.txt": "new"})
	checkFiles(t, view, wantThree) // the view is untouched
	if _, err := os.Stat(filepath.Join(view, "new.txt")); !os.IsNotExist(err) {
		t.Errorf("a root's write shows in the view: %v", err)
	}

	// A single layer's view is its own mount.
	one, releaseOne, err := c.View(ctx, layers[:1])
	if err != nil {
		t.Fatal(err)
	}
	if one != filepath.Join(e.dir, "mnt", hexOf(layers[0])) {
		t.Errorf("single-layer view at %s", one)
	}
	checkFiles(t, one, map[string]string{"shared.txt": "from base", "dir/a": "base a"})

	if got := mountsByType(t, e.dir); got["erofs"] != 3 || got["overlay"] != 2 {
		t.Errorf("mounts = %v, want 3 erofs and 2 overlays", got)
	}
	s := c.Stats()
	if s.Layers != 3 || s.Mounts != 3 || s.Views != 1 || s.Roots != 1 || s.Fetches != 3 {
		t.Errorf("Stats = %+v", s)
	}

	// GC with everything held unmounts nothing.
	if err := c.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mountsByType(t, e.dir); got["erofs"] != 3 || got["overlay"] != 2 {
		t.Errorf("GC unmounted something in use: %v", got)
	}

	releaseRoot()
	releaseRoot() // idempotent
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("root mount point left after release: %v", err)
	}
	releaseView()
	releaseView()
	releaseOne()
	checkFiles(t, filepath.Join(upper, "upper"), map[string]string{"shared.txt": "written"})
	gcAndCheckEmpty(t, c, e.dir)

	// The layer files are unchanged: they hash to the manifests' digests.
	for _, l := range layers {
		if err := verifyFiles(ctx, filepath.Join(e.dir, "files", hexOf(l)), hexOf(l), l.Manifest); err != nil {
			t.Errorf("layer files changed: %v", err)
		}
		js, err := os.ReadFile(filepath.Join(e.dir, "files", hexOf(l), layer.ManifestFile))
		if err != nil || layer.Digest(js) != l.ID {
			t.Errorf("layer.json of %s: digest %s, %v", l.ID, layer.Digest(js), err)
		}
	}
	if s := c.Stats(); s.Layers != 3 || s.Fetches != 3 {
		t.Errorf("files not kept after GC: %+v", s)
	}
}

func TestHardLinkFromLocalStore(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": random(2, 1<<20)})
	c := e.open(Options{})
	defer c.Close(ctx)
	_, release, err := c.View(ctx, []Layer{l})
	if err != nil {
		t.Fatal(err)
	}
	release()
	src, _ := e.store.Path(l.Manifest.Blob.Digest)
	a, err1 := os.Stat(src)
	b, err2 := os.Stat(filepath.Join(e.dir, "files", hexOf(l), layer.BlobFile))
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		t.Errorf("the blob was not hard-linked from the store (%v, %v)", err1, err2)
	}
	gcAndCheckEmpty(t, c, e.dir)

	// On another file system the files are copied. (The only other file
	// system at hand is tmpfs, from which EROFS cannot mount a file: the
	// mount fails, which also shows that a failed mount leaves nothing.)
	other := filepath.Join(e.root, "other")
	os.Mkdir(other, 0o755)
	if err := sys.MountTmpfs("layercache-test", other, "size=16m"); err != nil {
		t.Fatal(err)
	}
	defer sys.Unmount(other)
	c2 := e.open(Options{Dir: other})
	defer c2.Close(ctx)
	if _, _, err := c2.View(ctx, []Layer{l}); errdefs.CodeOf(err) != "layer_mount_failed" {
		t.Errorf("View with the cache on tmpfs: %v, want layer_mount_failed", err)
	}
	b, err2 = os.Stat(filepath.Join(other, "files", hexOf(l), layer.BlobFile))
	if err2 != nil || os.SameFile(a, b) {
		t.Errorf("blob across file systems: %v, same file %v", err2, err2 == nil && os.SameFile(a, b))
	}
	if s := c2.Stats(); s.Fetches != 1 || s.Layers != 1 || s.Mounts != 0 {
		t.Errorf("Stats = %+v", s)
	}
	gcAndCheckEmpty(t, c2, other)
}

func TestManySandboxesShareLayerMounts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	c := e.open(Options{})
	defer c.Close(ctx)

	const n = 100
	releases := make([]func(), 2*n)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			upper := filepath.Join(e.root, fmt.Sprintf("upper-%d", i))
			if err := os.Mkdir(upper, 0o755); err != nil {
				errs <- err
				return
			}
			dir, release, err := c.Root(ctx, fmt.Sprintf("sb-%d", i), layers, upper)
			if err != nil {
				errs <- err
				return
			}
			releases[i] = release
			if b, err := os.ReadFile(filepath.Join(dir, "shared.txt")); err != nil || string(b) != "from toolkit" {
				errs <- fmt.Errorf("root %d: %q, %v", i, b, err)
			}
		})
		wg.Go(func() {
			dir, release, err := c.View(ctx, layers)
			if err != nil {
				errs <- err
				return
			}
			releases[n+i] = release
			if b, err := os.ReadFile(filepath.Join(dir, "dir/b")); err != nil || string(b) != "workspace b" {
				errs <- fmt.Errorf("view %d: %q, %v", i, b, err)
			}
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent views")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := mountsByType(t, e.dir)
	if got["erofs"] != 3 || got["overlay"] != n+1 {
		t.Errorf("mounts = %v, want 3 erofs (one per layer) and %d overlays (%d roots + 1 view)", got, n+1, n)
	}
	if s := c.Stats(); s.Fetches != 3 || s.Mounts != 3 || s.Views != 1 || s.Roots != n {
		t.Errorf("Stats = %+v", s)
	}
	if err := c.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mountsByType(t, e.dir); got["erofs"] != 3 || got["overlay"] != n+1 {
		t.Errorf("GC unmounted something in use: %v", got)
	}
	for _, r := range releases {
		if r != nil {
			r()
		}
	}
	gcAndCheckEmpty(t, c, e.dir)
}

func TestRestartAdoptsMounts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	extra := e.layer(map[string]string{"only": "in extra"})
	c1 := e.open(Options{})

	uppers := []string{filepath.Join(e.root, "u0"), filepath.Join(e.root, "u1"), filepath.Join(e.root, "u2")}
	for _, u := range uppers {
		os.Mkdir(u, 0o755)
	}
	if _, _, err := c1.View(ctx, layers); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c1.View(ctx, layers[:1]); err != nil {
		t.Fatal(err)
	}
	for i, u := range uppers {
		stack := layers
		if i == 2 {
			stack = []Layer{layers[0], extra} // a sandbox the node will not recover
		}
		dir, _, err := c1.Root(ctx, fmt.Sprintf("sb-%d", i), stack, u)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "state"), []byte(u), 0o644)
	}
	before := mountsByType(t, e.dir)
	if before["erofs"] != 4 || before["overlay"] != 4 {
		t.Fatalf("mounts before restart = %v", before)
	}
	// A crash would also leave a half-made fetch and an empty mount point.
	os.MkdirAll(filepath.Join(e.dir, "tmp", "fetch-x", "y"), 0o700)
	os.Mkdir(filepath.Join(e.dir, "roots", "sb-lost"), 0o755)
	if err := c1.Close(ctx); err != nil {
		t.Fatal(err)
	}

	c2 := e.open(Options{})
	defer c2.Close(ctx)
	if s := c2.Stats(); s.Layers != 4 || s.Mounts != 4 || s.Views != 1 || s.Roots != 3 {
		t.Errorf("Stats after restart = %+v", s)
	}
	if ents := dirEntries(t, filepath.Join(e.dir, "tmp")); len(ents) != 0 {
		t.Errorf("tmp/ not emptied: %q", ents)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "roots", "sb-lost")); !os.IsNotExist(err) {
		t.Errorf("empty mount point kept: %v", err)
	}

	// The node service re-acquires what its recovered sandboxes use.
	view, releaseView, err := c2.View(ctx, layers)
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, view, wantThree)
	_, releaseOne, err := c2.View(ctx, layers[:1])
	if err != nil {
		t.Fatal(err)
	}
	var releaseRoots []func()
	for i, u := range uppers[:2] {
		dir, release, err := c2.Root(ctx, fmt.Sprintf("sb-%d", i), layers, u)
		if err != nil {
			t.Fatal(err)
		}
		releaseRoots = append(releaseRoots, release)
		checkFiles(t, dir, map[string]string{"state": u, "shared.txt": "from toolkit"})
	}
	if _, _, err := c2.Root(ctx, "sb-0", layers, uppers[0]); errdefs.CodeOf(err) != "root_exists" {
		t.Errorf("second Root of a held sandbox: %v, want root_exists", err)
	}
	if after := mountsByType(t, e.dir); !equalCounts(after, before) {
		t.Errorf("re-acquiring mounted again: %v, before restart %v", after, before)
	}
	if s := c2.Stats(); s.Fetches != 0 {
		t.Errorf("re-acquiring fetched: %+v", s)
	}

	// GC now removes only what no recovered sandbox took back: sb-2 and
	// the extra layer.
	if err := c2.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mountsByType(t, e.dir); got["erofs"] != 3 || got["overlay"] != 3 {
		t.Errorf("after GC: %v, want 3 erofs and 3 overlays", got)
	}
	checkFiles(t, view, wantThree)
	if _, err := os.Stat(filepath.Join(e.dir, "roots", "sb-2")); !os.IsNotExist(err) {
		t.Errorf("sb-2's root not removed: %v", err)
	}

	for _, r := range releaseRoots {
		r()
	}
	releaseView()
	releaseOne()
	gcAndCheckEmpty(t, c2, e.dir)
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestRestartRootMismatch(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	c1 := e.open(Options{})
	u := filepath.Join(e.root, "u")
	os.Mkdir(u, 0o755)
	if _, _, err := c1.Root(ctx, "sb", layers, u); err != nil {
		t.Fatal(err)
	}
	c1.Close(ctx)

	c2 := e.open(Options{})
	defer c2.Close(ctx)
	other := filepath.Join(e.root, "other")
	os.Mkdir(other, 0o755)
	if _, _, err := c2.Root(ctx, "sb", layers, other); errdefs.CodeOf(err) != "root_mismatch" || !errors.Is(err, errdefs.Conflict) {
		t.Errorf("Root over another upper: %v, want Conflict root_mismatch", err)
	}
	if _, _, err := c2.Root(ctx, "sb", layers[:2], u); errdefs.CodeOf(err) != "root_mismatch" {
		t.Errorf("Root over other layers: %v, want root_mismatch", err)
	}
	_, release, err := c2.Root(ctx, "sb", layers, u)
	if err != nil {
		t.Fatalf("Root with the same layers and upper: %v", err)
	}
	release()
	gcAndCheckEmpty(t, c2, e.dir)
}

func TestEvictionLRU(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var ls []Layer
	for i := range 4 {
		ls = append(ls, e.layer(map[string]string{"data": random(uint64(10+i), 1<<20)}))
	}
	size := ls[0].Manifest.Meta.Size + ls[0].Manifest.Blob.Size + 1024
	c := e.open(Options{Budget: 2*size + size/2})
	defer c.Close(ctx)
	cached := func() []string {
		var out []string
		for i, l := range ls {
			if _, err := os.Stat(filepath.Join(e.dir, "files", hexOf(l))); err == nil {
				out = append(out, fmt.Sprint(i))
			}
		}
		return out
	}
	use := func(i int) {
		t.Helper()
		_, release, err := c.View(ctx, ls[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		release()
	}

	_, releaseA, err := c.View(ctx, ls[0:1]) // held throughout: never evicted
	if err != nil {
		t.Fatal(err)
	}
	use(1)
	use(2)
	if err := c.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cached(); !slices.Equal(got, []string{"0", "2"}) {
		t.Errorf("cached after the first GC: %v, want [0 2] (1 is least recently used)", got)
	}
	use(3)
	if err := c.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cached(); !slices.Equal(got, []string{"0", "3"}) {
		t.Errorf("cached after the second GC: %v, want [0 3] (0 is held)", got)
	}
	releaseA()
	if err := c.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cached(); !slices.Equal(got, []string{"0", "3"}) {
		t.Errorf("cached within budget: %v, want [0 3]", got)
	}
	if s := c.Stats(); s.Evictions != 2 || s.Layers != 2 || s.Bytes > 2*size {
		t.Errorf("Stats = %+v", s)
	}
	// An evicted layer is fetched again.
	use(1)
	if s := c.Stats(); s.Fetches != 5 {
		t.Errorf("Fetches = %d, want 5", s.Fetches)
	}
	gcAndCheckEmpty(t, c, e.dir)
}

func TestFetchSingleFlight(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	store := newCountingStore(e.store)
	store.delay = 20 * time.Millisecond
	c := e.open(Options{Store: store})
	defer c.Close(ctx)

	const n = 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var releases []func()
	for i := range n {
		wg.Go(func() {
			var dir string
			var release func()
			var err error
			switch i % 3 {
			case 0:
				dir, release, err = c.View(ctx, layers)
			case 1:
				dir, release, err = c.View(ctx, layers[i%2:i%2+1])
			default:
				u := filepath.Join(e.root, fmt.Sprint("u", i))
				os.Mkdir(u, 0o755)
				dir, release, err = c.Root(ctx, fmt.Sprint("sb", i), layers, u)
			}
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := os.Stat(filepath.Join(dir, "shared.txt")); err != nil {
				t.Error(err)
			}
			mu.Lock()
			releases = append(releases, release)
			mu.Unlock()
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent views")
	opens := store.openCounts()
	if len(opens) != 6 {
		t.Errorf("opened %d files, want 6", len(opens))
	}
	for d, k := range opens {
		if k != 1 {
			t.Errorf("%s opened %d times, want once", d, k)
		}
	}
	if got := mountsByType(t, e.dir); got["erofs"] != 3 {
		t.Errorf("mounts = %v, want one erofs mount per layer", got)
	}
	if s := c.Stats(); s.Fetches != 3 || s.Hits < n {
		t.Errorf("Stats = %+v", s)
	}
	for _, r := range releases {
		r()
	}
	gcAndCheckEmpty(t, c, e.dir)
}

func TestFetchCancelledLeaderIsReplaced(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": "b"})
	store := newCountingStore(e.store)
	store.blockFirst.Store(true)
	c := e.open(Options{Store: store})
	defer c.Close(ctx)

	leaderCtx, cancel := context.WithCancel(ctx)
	leaderErr := make(chan error, 1)
	go func() {
		_, _, err := c.View(leaderCtx, []Layer{l})
		leaderErr <- err
	}()
	testenv.Recv(t, store.blocked, time.Minute, "the leader's fetch to block")
	follower := make(chan error, 1)
	var release func()
	go func() {
		var err error
		_, release, err = c.View(ctx, []Layer{l})
		follower <- err
	}()
	cancel()
	if err := testenv.Recv(t, leaderErr, time.Minute, "the cancelled leader"); !errors.Is(err, context.Canceled) {
		t.Errorf("leader: %v, want Canceled", err)
	}
	if err := testenv.Recv(t, follower, time.Minute, "the follower"); err != nil {
		t.Fatalf("follower: %v", err)
	}
	release()
	gcAndCheckEmpty(t, c, e.dir)
}

func TestCorruptStore(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	layers := e.threeLayers()
	store := newCountingStore(e.store)
	store.corrupt = true
	c := e.open(Options{Store: store})
	defer c.Close(ctx)

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, _, err := c.View(ctx, layers)
			if !errors.Is(err, errdefs.Internal) || errdefs.CodeOf(err) != "layer_corrupt" {
				t.Errorf("View from a corrupting store: %v, want Internal layer_corrupt", err)
			}
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent views")
	u := filepath.Join(e.root, "u")
	os.Mkdir(u, 0o755)
	if _, _, err := c.Root(ctx, "sb", layers, u); errdefs.CodeOf(err) != "layer_corrupt" {
		t.Errorf("Root from a corrupting store: %v", err)
	}
	if ents := dirEntries(t, u); len(ents) != 0 {
		t.Errorf("a failed Root left %q in the upper directory", ents)
	}
	for _, sub := range []string{"files", "tmp", "mnt", "views", "roots"} {
		if ents := dirEntries(t, filepath.Join(e.dir, sub)); len(ents) != 0 {
			t.Errorf("%s/ after corrupt fetches: %q", sub, ents)
		}
	}
	if m := mountsByType(t, e.dir); len(m) != 0 {
		t.Errorf("mounted a corrupt layer: %v", m)
	}
	if s := c.Stats(); s.Layers != 0 || s.Bytes != 0 || s.Fetches != 0 {
		t.Errorf("Stats = %+v", s)
	}
}

func TestCorruptLocalStoreLinked(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": random(3, 100000)})
	p, _ := e.store.Path(l.Manifest.Blob.Digest)
	b, _ := os.ReadFile(p)
	b[10] ^= 1
	if err := os.WriteFile(p, b, 0o444); err != nil {
		t.Fatal(err)
	}
	c := e.open(Options{})
	defer c.Close(ctx)
	if _, _, err := c.View(ctx, []Layer{l}); errdefs.CodeOf(err) != "layer_corrupt" {
		t.Errorf("View of a corrupt linked blob: %v, want layer_corrupt", err)
	}
	gcAndCheckEmpty(t, c, e.dir)
	if ents := dirEntries(t, filepath.Join(e.dir, "files")); len(ents) != 0 {
		t.Errorf("corrupt files kept: %q", ents)
	}
}

func TestNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": "b"})
	if err := e.store.Delete(ctx, l.Manifest.Blob.Digest); err != nil {
		t.Fatal(err)
	}
	c := e.open(Options{})
	defer c.Close(ctx)
	_, _, err := c.View(ctx, []Layer{l})
	if !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != "layer_not_found" {
		t.Errorf("View of a layer missing from the store: %v, want NotFound layer_not_found", err)
	}
	gcAndCheckEmpty(t, c, e.dir)
	if ents := dirEntries(t, filepath.Join(e.dir, "files")); len(ents) != 0 {
		t.Errorf("files/ = %q", ents)
	}
}

func TestDiskFull(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"big": random(4, 3<<20)})
	small := filepath.Join(e.root, "small")
	os.Mkdir(small, 0o755)
	if err := sys.MountTmpfs("layercache-test", small, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer sys.Unmount(small)
	c := e.open(Options{Dir: small})
	defer c.Close(ctx)
	_, _, err := c.View(ctx, []Layer{l})
	if !errors.Is(err, errdefs.Unavailable) || errdefs.CodeOf(err) != "layer_cache_full" {
		t.Errorf("View on a full disk: %v, want Unavailable layer_cache_full", err)
	}
	for _, sub := range []string{"files", "tmp", "mnt"} {
		if ents := dirEntries(t, filepath.Join(small, sub)); len(ents) != 0 {
			t.Errorf("%s/ after a failed fetch: %q", sub, ents)
		}
	}
}

func TestLazyVerifyAfterRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": random(5, 2<<20)})
	bad := e.layer(map[string]string{"b": "c"})
	store := newCountingStore(e.store) // copies: the cache's files are its own
	c1 := e.open(Options{Store: store})
	for _, x := range []Layer{l, bad} {
		_, release, err := c1.View(ctx, []Layer{x})
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	gcAndCheckEmpty(t, c1, e.dir)
	c1.Close(ctx)

	// Flip a byte of l's blob (same size: New's quick check passes) and
	// break bad's layer.json (New removes it).
	blob := filepath.Join(e.dir, "files", hexOf(l), layer.BlobFile)
	b, _ := os.ReadFile(blob)
	b[len(b)-1] ^= 1
	os.Chmod(blob, 0o644)
	if err := os.WriteFile(blob, b, 0o444); err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(e.dir, "files", hexOf(bad), layer.ManifestFile)
	os.Chmod(js, 0o644)
	os.WriteFile(js, []byte("{"), 0o444)

	c2 := e.open(Options{Store: store})
	defer c2.Close(ctx)
	if s := c2.Stats(); s.Layers != 1 {
		t.Errorf("Stats after restart = %+v, want the bad layer.json removed", s)
	}
	dir, release, err := c2.View(ctx, []Layer{l})
	if err != nil {
		t.Fatal(err)
	}
	checkFiles(t, dir, map[string]string{"a": random(5, 2<<20)})
	release()
	if s := c2.Stats(); s.Fetches != 1 {
		t.Errorf("Fetches = %d, want the corrupt layer fetched again", s.Fetches)
	}
	if err := verifyFiles(ctx, filepath.Join(e.dir, "files", hexOf(l)), hexOf(l), l.Manifest); err != nil {
		t.Error(err)
	}
	gcAndCheckEmpty(t, c2, e.dir)
}

func TestInvalidRequests(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l := e.layer(map[string]string{"a": "b"})
	c := e.open(Options{})
	u := filepath.Join(e.root, "u")
	os.Mkdir(u, 0o755)
	wrongID := l
	wrongID.ID = layer.Digest([]byte("x"))
	for _, tc := range []struct {
		name string
		call func() error
		code string
	}{
		{"no layers", func() error { _, _, err := c.View(ctx, nil); return err }, "no_layers"},
		{"wrong ID", func() error { _, _, err := c.View(ctx, []Layer{wrongID}); return err }, "layer_id_mismatch"},
		{"duplicate", func() error { _, _, err := c.View(ctx, []Layer{l, l}); return err }, "duplicate_layer"},
		{"bad sandbox ID", func() error { _, _, err := c.Root(ctx, "../x", []Layer{l}, u); return err }, "invalid_sandbox_id"},
		{"relative upper", func() error { _, _, err := c.Root(ctx, "sb", []Layer{l}, "u"); return err }, "invalid_upper"},
		{"upper with a comma", func() error { _, _, err := c.Root(ctx, "sb", []Layer{l}, u+",x"); return err }, "invalid_upper"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != tc.code {
				t.Errorf("got %v, want Invalid %s", err, tc.code)
			}
		})
	}
	c.Close(ctx)
	if _, _, err := c.View(ctx, []Layer{l}); errdefs.CodeOf(err) != "layer_cache_closed" {
		t.Errorf("View after Close: %v", err)
	}
	if _, err := New(ctx, Options{Dir: filepath.Join(e.root, "a:b"), Store: e.store}); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("New in a directory with ':': %v", err)
	}
	if ents := dirEntries(t, u); len(ents) != 0 {
		t.Errorf("upper directory: %q", ents)
	}
}
