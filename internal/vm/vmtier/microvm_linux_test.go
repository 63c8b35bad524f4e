package vmtier

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/vminit"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sandbox/sandboxtest"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// Caches shared with other test binaries: the built-in layers (as the
// container tier's tests build them) and the guest kernel (as vmkernel's
// tests fetch it; the first fetch needs the Debian mirror).
var (
	builtinCache = filepath.Join(os.TempDir(), "dsec-test-builtin")
	kernelCache  = filepath.Join(os.TempDir(), "dsec-test-vmkernel")
)

// testWorld holds the busybox image's layers in a blob store and a layer
// cache over it, shared by the tests of this binary.
type testWorld struct {
	once   sync.Once
	err    error
	dir    string
	cache  *layercache.Cache
	layers []layerspec.Layer // base/busybox + toolkit/dsec-guest
	store  *blobstore.Local  // the layers' files (tests may publish more)
}

var world testWorld

func TestMain(m *testing.M) {
	testenv.SweepDeadTests()
	code := m.Run()
	if world.cache != nil {
		world.cache.Close(context.Background())
	}
	if world.dir != "" {
		testenv.UnmountAll(world.dir)
		os.RemoveAll(world.dir)
	}
	os.Exit(code)
}

func (w *testWorld) get(t testing.TB) *testWorld {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the microvm tier's tests need root (layer mounts)")
	}
	if testing.Short() {
		t.Skip("boots a VM under TCG: skipped in -short mode")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skipf("no qemu-system-x86_64 (Debian qemu-system-x86): %v", err)
	}
	w.once.Do(func() { w.err = w.init() })
	if w.err != nil {
		t.Fatalf("setting up the test layers: %v", w.err)
	}
	return w
}

func (w *testWorld) init() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "TestMicroVMWorld")
	if err != nil {
		return err
	}
	w.dir = dir
	store, err := blobstore.NewLocal(filepath.Join(dir, "blobs"))
	if err != nil {
		return err
	}
	w.store = store
	for _, name := range []string{builtin.Busybox, builtin.Guest} {
		for _, spec := range builtin.Specs("test") {
			if spec.Name != name {
				continue
			}
			a, err := builtin.Ensure(ctx, builtinCache, spec, slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			if err := publish(ctx, store, a); err != nil {
				return err
			}
			w.layers = append(w.layers, layerspec.Layer{ID: a.ID(), Manifest: a.Manifest})
		}
	}
	w.cache, err = layercache.New(ctx, layercache.Options{Dir: filepath.Join(dir, "layers"), Store: store})
	return err
}

func publish(ctx context.Context, store *blobstore.Local, a layer.Artifact) error {
	for name, ref := range map[string]layer.FileRef{layer.MetaFile: a.Manifest.Meta, layer.BlobFile: a.Manifest.Blob} {
		f, err := os.Open(filepath.Join(a.Dir, name))
		if err != nil {
			return err
		}
		_, err = store.Put(ctx, ref.Digest, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// busyboxSpec is the tests' and benchmarks' VM: the busybox image, one
// vCPU, 256 MiB of memory and a 64 MiB upper, on tier (Tier or VMTier).
func busyboxSpec(id, tier string) sandbox.Spec {
	return sandbox.Spec{
		ID: id, Tier: tier, CPU: 1, MemoryMB: 256, DiskMB: 64,
		Image: sandbox.Image{ID: "busybox", Name: "busybox", Layers: world.layers},
	}
}

// newRuntime returns a runtime with a short state directory (socket paths
// are limited to 107 bytes), and checks after the test that nothing of
// its VMs is left.
func newRuntime(t testing.TB) (*Runtime, string) {
	t.Helper()
	w := world.get(t)
	guest, err := builtin.GuestBinary("test")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(guest, []byte("dsec-config")) {
		t.Fatal("the embedded dsec-guest predates the microvm sandbox mode: run `make build`")
	}
	dir, err := os.MkdirTemp("", "mvm-")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(context.Background(), Options{
		StateDir: filepath.Join(dir, "vms"), CacheDir: kernelCache, Guest: guest, Version: "test",
		Layers: CacheFiles{Cache: w.cache},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close(context.Background())
		if ps := qemuProcs(dir); len(ps) > 0 {
			t.Errorf("QEMU processes left: %+v", ps)
			for _, p := range ps {
				if pr, err := os.FindProcess(p.Pid); err == nil {
					pr.Kill()
				}
			}
		}
		if entries, _ := os.ReadDir(filepath.Join(dir, "vms")); len(entries) > 0 {
			t.Errorf("run directories left: %v", entries)
		}
		os.RemoveAll(dir)
	})
	return rt, dir
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func qemuProcs(dir string) []testenv.Proc {
	var out []testenv.Proc
	for _, p := range testenv.Procs() {
		if strings.Contains(p.Cmdline, dir) || p.State == 'Z' && strings.Contains(p.Cmdline, "qemu") {
			out = append(out, p)
		}
	}
	return out
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestPortNames(t *testing.T) {
	if vminit.AgentPortName != vmm.AgentPortName {
		t.Errorf("the guest serves on port %q, QEMU names it %q", vminit.AgentPortName, vmm.AgentPortName)
	}
}

// TestExecFilesDestroy boots one microVM from the busybox image and runs
// the slice end to end: exec, the guest's own kernel, files, destroy,
// nothing left.
func TestExecFilesDestroy(t *testing.T) {
	rt, dir := newRuntime(t)
	ctx := ctxT(t, 3*time.Minute)
	start := time.Now()
	spec := busyboxSpec("mvm-t1", Tier)
	spec.Env = map[string]string{"GREETING": "hi"}
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	created := time.Since(start)
	msb := sb.(*Sandbox)
	t.Logf("create to ready: %v (QEMU pid %d)", created.Round(time.Millisecond), msb.Pid())
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			sb.Destroy(context.Background())
		}
	})

	exec := func(argv ...string) api.ExecResult {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: argv}})
		if err != nil {
			t.Fatalf("Exec %q: %v", argv, err)
		}
		return res
	}
	if res := exec("echo", "hello"); res.ExitCode != 0 || res.Stdout != "hello\n" {
		t.Errorf("echo hello: %+v", res)
	}
	var lat []time.Duration
	for range 10 {
		s := time.Now()
		exec("true")
		lat = append(lat, time.Since(s))
	}
	slices.Sort(lat)
	t.Logf("exec latency (true, 10 runs): p50 %v, max %v", lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))

	// The guest's kernel, not the host's: the negative control that the
	// command ran in a VM.
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	res := exec("uname", "-r")
	if got := strings.TrimSpace(res.Stdout); got != rt.kernel.Release || got == strings.TrimSpace(string(host)) {
		t.Errorf("uname -r in the guest = %q; want the guest kernel's %q, not the host's %q", got, rt.kernel.Release, strings.TrimSpace(string(host)))
	}
	if res := exec("sh", "-c", `echo "$GREETING $(hostname) $(id -u)"`); res.Stdout != "hi mvm-t1 0\n" {
		t.Errorf("env, host name and uid: %+v", res)
	}

	fs := sb.Files()
	want := "written through the files API\n"
	if _, err := fs.Write(ctx, "/workspace/note.txt", strings.NewReader(want), sandbox.WriteOptions{}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	rc, fi, err := fs.Open(ctx, "/workspace/note.txt")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != want || fi.Size != int64(len(want)) {
		t.Errorf("read back %q (size %d, err %v), want %q", got, fi.Size, err, want)
	}
	if res := exec("cat", "/workspace/note.txt"); res.Stdout != want {
		t.Errorf("cat of the written file: %+v", res)
	}
	st, err := sb.Stats(ctx)
	if err != nil || st.MemoryLimitBytes == 0 || st.Processes == 0 {
		t.Errorf("Stats = %+v, %v", st, err)
	}

	s := time.Now()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	destroyed = true
	t.Logf("destroy: %v", time.Since(s).Round(time.Millisecond))
	if ps := qemuProcs(dir); len(ps) > 0 {
		t.Errorf("QEMU left after Destroy: %+v", ps)
	}
	if _, err := os.Stat(msb.RunDir()); !os.IsNotExist(err) {
		t.Errorf("run directory %s after Destroy: %v", msb.RunDir(), err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}); err == nil {
		t.Error("Exec after Destroy succeeded")
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}

// TestConformance runs the tier conformance suite on microVMs. Every
// sandbox is a VM boot under TCG (seconds each: ~90 s in all); -short
// skips it, as it skips every boot (newRuntime's check).
func TestConformance(t *testing.T) {
	w := world.get(t)
	guest, err := builtin.GuestBinary("test")
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.Suite(t, sandboxtest.Factory{
		New: func(t *testing.T, dir string) sandbox.Runtime {
			// The suite's directories are too long for socket paths: a
			// short one is derived from it, the same for the same dir.
			sum := sha256.Sum256([]byte(dir))
			short := filepath.Join(os.TempDir(), "mvm-"+hex.EncodeToString(sum[:6]))
			rt, err := New(context.Background(), Options{
				StateDir: short, CacheDir: kernelCache, Guest: guest, Version: "test",
				Layers: CacheFiles{Cache: w.cache},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if ps := qemuProcs(short); len(ps) > 0 {
					t.Errorf("QEMU processes left: %+v", ps)
				}
				os.RemoveAll(short)
			})
			return rt
		},
		Image:    sandbox.Image{ID: "busybox", Name: "busybox", Layers: w.layers},
		Commands: busyboxCommands,
	})
}

var sh = sandboxtest.Sh

// busyboxCommands are the suite's programs in the busybox image, but for
// the allocation: dd's buffer is one allocation of the size, filled by
// the read, where a shell variable built by tr (the container tier's
// way) takes minutes to grow under TCG.
var busyboxCommands = func() sandboxtest.Commands {
	c := sandboxtest.Busybox
	c.AllocMB = func(mb int) []string {
		return []string{"dd", "if=/dev/zero", "of=/dev/null", "count=1", "bs=" + strconv.Itoa(mb) + "M"}
	}
	return c
}()

// TestBootTimeoutLeavesNothing: a VM that is not ready within the boot
// timeout is killed, and the failed Create leaves no process, socket or
// run directory (newRuntime's cleanup checks).
func TestBootTimeoutLeavesNothing(t *testing.T) {
	rt, _ := newRuntime(t)
	rt.opt.BootTimeout = 300 * time.Millisecond
	_, err := rt.Create(ctxT(t, time.Minute), busyboxSpec("mvm-t2", Tier))
	if errdefs.CodeOf(err) != vmm.CodeBootTimeout {
		t.Fatalf("Create with a 300 ms boot timeout: %v, want code %s", err, vmm.CodeBootTimeout)
	}
	if entries, _ := os.ReadDir(rt.opt.StateDir); len(entries) > 0 {
		t.Errorf("run directories after a failed Create: %v", entries)
	}
}
