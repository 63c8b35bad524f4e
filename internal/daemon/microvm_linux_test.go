package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// microvmKernelCache is internal/vm/vmkernel's and internal/vm/vmtier's test
// cache of the guest kernel: the tests of every package fetch it once.
var microvmKernelCache = filepath.Join(os.TempDir(), "dsec-test-vmkernel")

// withMicroVM is a startUp adjustment that turns the microvm tier on over
// the shared kernel cache.
func withMicroVM(t testing.TB) func(*config.Config) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("the microvm tier needs QEMU (Debian qemu-system-x86)")
	}
	// Cgroup parents of the test's own: a node's Recover removes the
	// groups under its parents that it does not own, so daemons running
	// at once must not share them.
	n := cgroupSeq.Add(1)
	mvm := fmt.Sprintf("dsec-test-%d-%d-microvm", os.Getpid(), n)
	vm := fmt.Sprintf("dsec-test-%d-%d-vm", os.Getpid(), n)
	t.Cleanup(func() {
		for _, p := range []string{mvm, vm} {
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", p))
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", p))
			for _, d := range dirs {
				if subs, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs")); len(subs) > 0 {
					t.Errorf("cgroups left under %s: %v", d, subs)
				}
				os.Remove(d)
			}
		}
	})
	return func(c *config.Config) {
		c.MicroVM.Disabled = false
		c.MicroVM.CacheDir = microvmKernelCache
		c.MicroVM.CgroupParent, c.VM.CgroupParent = mvm, vm
	}
}

// cgroupSeq numbers withMicroVM's cgroup parents.
var cgroupSeq atomic.Int64

// qemuProcsUnder lists the QEMU processes whose command line names dir.
func qemuProcsUnder(dir string) []testenv.Proc {
	var out []testenv.Proc
	for _, p := range testenv.Procs() {
		if strings.Contains(p.Cmdline, "qemu") && strings.Contains(p.Cmdline, dir) {
			out = append(out, p)
		}
	}
	return out
}

// vmDataDir is a data directory for a daemon with VM tiers, short (a
// VM's sockets live under <dir>/node/<tier>/<id>/), removed after the
// test, which fails if a QEMU process of it is left (and kills it).
func vmDataDir(t *testing.T, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ps := qemuProcsUnder(dir); len(ps) > 0 {
			t.Errorf("QEMU processes left: %v", ps)
			for _, p := range ps {
				if pr, err := os.FindProcess(p.Pid); err == nil {
					_ = pr.Kill()
				}
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing the data directory: %v", err)
		}
	})
	return dir
}

// TestMicroVMThroughTheAPI runs one microvm sandbox through `dsec up`'s
// API: the node reports the tier and its accelerator, commands run in a
// kernel of their own, files go in and out, what the tier's first slice
// cannot do is refused with 422 unsupported_on_tier, and nothing of QEMU
// is left after the delete. One TCG boot.
func TestMicroVMThroughTheAPI(t *testing.T) {
	on := withMicroVM(t)
	// Short: the VM's sockets live under <dir>/node/microvm/<id>/.
	dir := vmDataDir(t, "TestMvm")
	u := startUp(t, dir, on)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	nodes, err := u.c.Nodes(ctx)
	if err != nil || len(nodes.Nodes) != 1 {
		t.Fatalf("nodes: %+v, %v", nodes, err)
	}
	i := slices.IndexFunc(nodes.Nodes[0].Tiers, func(ti api.TierInfo) bool { return ti.Name == api.TierMicroVM })
	if i < 0 {
		t.Fatalf("the node does not list the microvm tier: %+v", nodes.Nodes[0].Tiers)
	}
	if ti := nodes.Nodes[0].Tiers[i]; !ti.Available || (ti.Accelerator != "tcg" && ti.Accelerator != "kvm") {
		t.Fatalf("microvm tier: %+v, want available on tcg or kvm", ti)
	} else {
		t.Logf("microvm tier: %+v", ti)
	}

	// Refused before any VM boots.
	for _, tc := range []struct {
		name, code string
		req        api.CreateSandboxRequest
	}{
		// This node runs no container tier: no network manager.
		{"egress", "unsupported_on_tier", api.CreateSandboxRequest{Tier: api.TierMicroVM, Network: &api.NetworkPolicy{Egress: api.EgressOpen}}},
		// A VM's execs are out of the node's monitor's sight.
		{"allowed executables", "executables_unenforced", api.CreateSandboxRequest{Tier: api.TierMicroVM, Phases: []api.Phase{{Name: "a", Executables: []string{"/bin/sh"}}, {Name: "b"}}}},
	} {
		_, err := u.c.CreateSandbox(ctx, tc.req)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.StatusCode != 422 || ce.Code != tc.code {
			t.Errorf("create with %s: %v, want 422 %s", tc.name, err, tc.code)
		}
	}

	start := time.Now()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("created %s (image %s) in %v", sb.ID, sb.Image, time.Since(start).Round(time.Millisecond))
	if sb.Tier != api.TierMicroVM || sb.State != api.StateRunning {
		t.Errorf("sandbox: %+v", sb)
	}

	// The negative control: a VM runs its own kernel.
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"uname", "-r"}})
	if err != nil {
		t.Fatal(err)
	}
	if guest := strings.TrimSpace(res.Stdout); res.ExitCode != 0 || guest == "" || guest == strings.TrimSpace(string(host)) {
		t.Errorf("uname -r in the VM: %+v; the host's is %s", res, host)
	}

	body := []byte("written through the files API\n")
	if _, err := u.c.WriteFile(ctx, sb.ID, "/tmp/dsec/note.txt", bytes.NewReader(body), client.WriteOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := u.c.ReadFileBytes(ctx, sb.ID, "/tmp/dsec/note.txt"); err != nil || !bytes.Equal(got, body) {
		t.Errorf("read back %q, %v", got, err)
	}
	if res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat", "/tmp/dsec/note.txt"}}); err != nil || res.Stdout != string(body) {
		t.Errorf("cat in the VM: %+v, %v", res, err)
	}

	// A background process runs in the guest.
	p, err := u.c.StartProcess(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})
	if err != nil {
		t.Fatalf("start a process: %v", err)
	}
	if res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat", fmt.Sprintf("/proc/%d/comm", p.Pid)}}); err != nil || res.Stdout != "sleep\n" {
		t.Errorf("the started process (pid %d) in the guest: %+v, %v", p.Pid, res, err)
	}

	if err := u.c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if ps := qemuProcsUnder(dir); len(ps) > 0 {
		t.Errorf("QEMU processes after the delete: %v", ps)
	}
	u.stop()
	if ps := qemuProcsUnder(dir); len(ps) > 0 {
		t.Errorf("QEMU processes after the daemon stopped: %v", ps)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "node", "microvm")); len(ents) > 0 {
		t.Errorf("run directories left: %v", ents)
	}
}

// TestUpReadyWithGuestKernel starts `dsec up` with the VM tiers on an
// empty kernel cache, as a first start does: by the time it reports
// ready, the guest kernel has been fetched and the initramfs built, so
// that no create waits for them (the fetch takes tens of seconds, which a
// create's caller would otherwise spend waiting without being told why).
// It fetches the kernel package from the apt mirror, and logs how long
// the start took; the waits are raised for a loaded machine and -race
// (whose build decompresses the kernel several times slower).
func TestUpReadyWithGuestKernel(t *testing.T) {
	on := withMicroVM(t)
	defer func(w, r time.Duration) { guestKernelWait, readyWait = w, r }(guestKernelWait, readyWait)
	guestKernelWait, readyWait = 10*time.Minute, 11*time.Minute
	dir := vmDataDir(t, "TestMvk")
	cache := filepath.Join(dir, "kernel-cache")
	start := time.Now()
	u := startUp(t, dir, func(c *config.Config) {
		on(c)
		c.MicroVM.CacheDir = cache
	})
	t.Logf("dsec up was ready after %v on an empty kernel cache", time.Since(start).Round(time.Millisecond))
	kernels, _ := filepath.Glob(filepath.Join(cache, "kernel", "r*", "*", "manifest.json"))
	initrds, _ := filepath.Glob(filepath.Join(cache, "initramfs", "*.cpio"))
	if len(kernels) == 0 || len(initrds) == 0 {
		t.Errorf("at ready, the kernel cache holds kernels %v and initramfs %v; want both", kernels, initrds)
	}
	u.stop()

	// A second start finds them cached.
	start = time.Now()
	u = startUp(t, dir, func(c *config.Config) {
		on(c)
		c.MicroVM.CacheDir = cache
	})
	t.Logf("dsec up was ready after %v with the kernel cached", time.Since(start).Round(time.Millisecond))
	u.stop()
}

// TestStopWhileWaitingForGuestKernel stops `dsec up` while its start waits
// for the guest kernel (held here: the test holds the kernel cache's lock,
// so the fetch cannot begin): Run returns nil at once, without having
// reported ready or opened the API, and leaves nothing mounted.
func TestStopWhileWaitingForGuestKernel(t *testing.T) {
	on := withMicroVM(t)
	dir := vmDataDir(t, "TestMvw")
	cache := filepath.Join(dir, "kernel-cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	unlock, err := sys.LockFile(context.Background(), filepath.Join(cache, "kernel.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	cfg := config.Defaults()
	cfg.DataDir, cfg.API.Listen, cfg.NATS.Listen, cfg.Node.ID = dir, "127.0.0.1:0", "none", "test-node"
	cfg.Images.BuiltinCache, cfg.Images.SkipSlow = builtinCache, true
	cfg.Node.FunctionCacheDir = wasmCache
	cfg.Container.Disabled = true
	on(&cfg)
	cfg.MicroVM.CacheDir = cache
	lines := &logLines{}
	log := slog.New(slog.NewTextHandler(testWriter{t, lines}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, ready := make(chan error, 1), make(chan struct{}, 1)
	go func() { done <- Run(ctx, RoleUp, cfg, Build{Version: "test"}, log, func(Info) { ready <- struct{}{} }) }()
	deadline := time.Now().Add(2 * time.Minute)
	for len(lines.matching("guest kernel before serving")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the start did not begin waiting for the guest kernel")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // still waiting: the lock is held
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run stopped while starting: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its context's end")
	}
	select {
	case <-ready:
		t.Error("reported ready without the guest kernel")
	default:
	}
	if _, err := os.Stat(filepath.Join(dir, AddrFile)); !os.IsNotExist(err) {
		t.Errorf("the API address file: %v, want none (the API never opened)", err)
	}
	testenv.NoMountsUnder(t, dir)
}
