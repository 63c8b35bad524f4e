package container

import (
	"context"
	"fmt"
	"github.com/dsec-dev/dsec/api"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/seccomp"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// builtinCache is shared with the other test binaries (see the daemon's
// harness): built-in layers are built once per machine and version.
var builtinCache = filepath.Join(os.TempDir(), "dsec-test-builtin")

func TestMain(m *testing.M) {
	testenv.SweepStale(2 * time.Hour)
	testenv.SweepDeadTests()
	code := m.Run()
	world.close()
	os.Exit(code)
}

// needRoot skips on machines where the tier cannot exist at all.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the container tier needs root (namespaces, mounts, cgroups, nftables)")
	}
}

// testWorld is what every test runtime of this process shares: the blob
// store with the test images' layers, and the user namespace id-mapped
// layers are shown through.
type testWorld struct {
	once     sync.Once
	err      error
	dir      string
	usernsFd int
	store    *blobstore.Local
	busybox  []layerspec.Layer // base/busybox + toolkit/dsec-guest
	bare     []layerspec.Layer // base/busybox alone: no agent
}

var world testWorld

func (w *testWorld) get(t testing.TB) *testWorld {
	t.Helper()
	needRoot(t)
	w.once.Do(func() { w.err = w.init() })
	if w.err != nil {
		t.Fatalf("setting up the container test world: %v", w.err)
	}
	return w
}

func (w *testWorld) init() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "TestContainerWorld")
	if err != nil {
		return err
	}
	w.dir = dir
	if err := os.Chmod(dir, 0o711); err != nil { // see reachable
		return err
	}
	if w.store, err = blobstore.NewLocal(filepath.Join(dir, "blobs")); err != nil {
		return err
	}
	var bb, guest layerspec.Layer
	for _, spec := range builtin.Specs("test") {
		if spec.Name != builtin.Busybox && spec.Name != builtin.Guest {
			continue
		}
		a, err := builtin.Ensure(ctx, builtinCache, spec, slog.New(slog.DiscardHandler))
		if err != nil {
			return fmt.Errorf("building %s: %w", spec.Name, err)
		}
		l, err := w.publish(ctx, a)
		if err != nil {
			return err
		}
		if spec.Name == builtin.Busybox {
			bb = l
		} else {
			guest = l
		}
	}
	w.busybox = []layerspec.Layer{bb, guest}
	w.bare = []layerspec.Layer{bb}
	w.usernsFd, err = sys.NewUserns(DefaultIDBase, DefaultIDBase, 65536)
	return err
}

// publish puts a built layer's files in the test blob store.
func (w *testWorld) publish(ctx context.Context, a layer.Artifact) (layerspec.Layer, error) {
	for name, ref := range map[string]layer.FileRef{layer.MetaFile: a.Manifest.Meta, layer.BlobFile: a.Manifest.Blob} {
		f, err := os.Open(filepath.Join(a.Dir, name))
		if err != nil {
			return layerspec.Layer{}, err
		}
		_, err = w.store.Put(ctx, ref.Digest, f)
		f.Close()
		if err != nil {
			return layerspec.Layer{}, err
		}
	}
	return layerspec.Layer{ID: a.ID(), Manifest: a.Manifest}, nil
}

func (w *testWorld) close() {
	if w.usernsFd > 0 {
		_ = sys.CloseFd(w.usernsFd)
	}
	if w.dir != "" {
		testenv.UnmountAll(w.dir)
		_ = os.RemoveAll(w.dir)
	}
}

// image is the busybox test image of the world.
func (w *testWorld) image() sandbox.Image {
	return sandbox.Image{ID: "busybox", Name: "busybox", Layers: w.busybox}
}

// Each runtime a test makes gets a network instance and a cgroup parent
// of its own, named after this process and the runtime's state directory,
// so that its Recover sweeps only its own and a runtime made again on the
// same directory finds what the first left.
var slots = struct {
	sync.Mutex
	byDir map[string]int
}{byDir: map[string]int{}}

func slotOf(dir string) int {
	slots.Lock()
	defer slots.Unlock()
	n, ok := slots.byDir[dir]
	if !ok {
		n = len(slots.byDir)
		slots.byDir[dir] = n
	}
	return n
}

// names are the host-visible names of a test runtime's sandboxes.
func names(dir string) (testenv.Sandboxes, netip.Prefix) {
	n := slotOf(dir)
	pid := os.Getpid()
	s := testenv.Sandboxes{
		Net:          fmt.Sprintf("dc%02x%02x", pid&0xff, n&0xff),
		CgroupParent: fmt.Sprintf("dsec-test-%d-%d", pid, n),
	}
	// 10.224.0.0/12 is this package's; each runtime gets a /24 of it.
	r := netip.AddrFrom4([4]byte{10, byte(224 + pid%16), byte(n), 0})
	return s, netip.PrefixFrom(r, 24)
}

// testRuntime is a runtime with its own layer cache and network and
// cgroup managers, as a node has: closing it and making a new one over
// the same directory is a node service restart.
type testRuntime struct {
	*Runtime
	layers  *layercache.Cache
	nets    *network.Manager
	cgroups *cgroups.Manager
	names   testenv.Sandboxes
	// benchNet is the network policy of the benchmarks' sandboxes
	// (nil: none, a namespace of their own with lo alone).
	benchNet *api.NetworkPolicy
}

// Close closes the runtime, then what it used; live sandboxes keep their
// mounts and networks for the next runtime over the same directory.
func (r *testRuntime) Close(ctx context.Context) error {
	err := r.Runtime.Close(ctx)
	if cerr := r.nets.Close(ctx); err == nil {
		err = cerr
	}
	if cerr := r.cgroups.Close(ctx); err == nil {
		err = cerr
	}
	if cerr := r.layers.GC(ctx); err == nil {
		err = cerr
	}
	if cerr := r.layers.Close(ctx); err == nil {
		err = cerr
	}
	return err
}

type runtimeOptions struct {
	noSeccomp    bool
	pool         int
	reuse        bool          // network.Options.Reuse
	warm         int           // Options.Warm
	agents       int           // Options.WarmAgents
	phaseTimeout time.Duration // Options.PhaseTimeout
	monitor      watcher
	// netRange, if set, replaces the /24 of names (the density benchmark
	// needs thousands of addresses); it must not overlap 10.224.0.0/12.
	netRange netip.Prefix
	// hostUID, if set, is the runtime's id range (Options.HostUID and
	// HostGID) instead of DefaultIDBase: the layers stay id-mapped to
	// DefaultIDBase, so its sandboxes are for what needs no root of
	// theirs (the stray tests).
	hostUID int
	// noZygote: Options.NoZygote (the node forks sandboxes itself).
	noZygote bool
}

// newRuntime makes a runtime over dir. At the test's end it is closed,
// and nothing of its sandboxes may be left on the host.
func newRuntime(t testing.TB, dir string, ro runtimeOptions) *testRuntime {
	t.Helper()
	w := world.get(t)
	ctx := context.Background()
	nm, rng := names(dir)
	if ro.netRange.IsValid() {
		rng = ro.netRange
	}
	log := testLogger(t)
	cg, err := cgroups.New(ctx, cgroups.Options{Parent: nm.CgroupParent, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	pool := ro.pool
	if pool == 0 {
		pool = -1
	}
	nets, err := network.New(ctx, network.Options{
		Name: nm.Net, Range: rng, PoolSize: pool, Reuse: ro.reuse, Logger: log,
		StateDir: filepath.Join(dir, "netstate"),
	})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := layercache.New(ctx, layercache.Options{
		Dir: filepath.Join(dir, "layers"), Store: w.store, Logger: log,
		IDMap: &layercache.IDMap{UsernsFd: w.usernsFd, HostUID: DefaultIDBase, HostGID: DefaultIDBase},
	})
	if err != nil {
		_ = nets.Close(ctx)
		t.Fatal(err)
	}
	opt := Options{
		StateDir: dir, DataDir: tempTop(dir), Reach: []string{filepath.Join(dir, "layers")},
		Layers: layers, Network: nets, Cgroups: cg, Logger: log, Version: "test",
		Warm: ro.warm, WarmAgents: ro.agents, Monitor: ro.monitor, HostUID: ro.hostUID, HostGID: ro.hostUID, NoZygote: ro.noZygote,
		PhaseTimeout: ro.phaseTimeout,
	}
	if !ro.noSeccomp {
		opt.Seccomp = func(caps []string) ([]byte, error) { return seccomp.Program(seccomp.Options{Caps: caps}) }
	}
	rt, err := New(ctx, opt)
	if err != nil {
		_ = nets.Close(ctx)
		_ = layers.Close(ctx)
		t.Fatal(err)
	}
	tr := &testRuntime{Runtime: rt, layers: layers, nets: nets, cgroups: cg, names: nm}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = tr.Close(ctx)
		removeEmptyParents(nm.CgroupParent)
	})
	return tr
}

// checkHost asserts that nothing of the runtime over dir is left on the
// host and removes its (empty) cgroup parents.
func checkHost(t testing.TB, dir string) {
	t.Helper()
	nm, _ := names(dir)
	testenv.NoHostLeftovers(t, nm)
	testenv.NoMountsUnder(t, dir)
	removeEmptyParents(nm.CgroupParent)
}

// removeEmptyParents removes a runtime's cgroup parent from every
// hierarchy where it is empty (the runtime leaves it when it closes).
func removeEmptyParents(parent string) {
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", parent))
	for _, p := range append(parents, filepath.Join("/sys/fs/cgroup", parent)) {
		_ = os.Remove(p)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// tempTop is the directory of os.TempDir that holds dir: the test's own
// (t.TempDir makes it 0700), which sandboxes must be able to walk through.
func tempTop(dir string) string {
	tmp := filepath.Clean(os.TempDir())
	rel, err := filepath.Rel(tmp, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return dir
	}
	return filepath.Join(tmp, strings.Split(rel, string(filepath.Separator))[0])
}
