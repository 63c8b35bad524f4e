package vmtier

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sandbox/sandboxtest"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// testUIDBase keeps the tests' QEMU uids apart from a node's (and from
// the container tier's).
const testUIDBase = 1200000

// jailedRuntime returns a runtime of machine m whose QEMUs run jailed
// (their own uid, a cgroup under a parent of the test's own), and checks
// after the test that nothing of its VMs is left: no process, run
// directory or cgroup. stateDir, if set, is used instead of a new one.
func jailedRuntime(t testing.TB, m vmm.Machine, stateDir string) (*Runtime, *cgroups.Manager) {
	t.Helper()
	w := world.get(t)
	guest, err := builtin.GuestBinary("test")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(guest, []byte("PCIModules")) && !bytes.Contains(guest, []byte("virtio_pci")) {
		t.Fatal("the embedded dsec-guest predates the vm tier: run `make build`")
	}
	if stateDir == "" {
		dir, err := os.MkdirTemp("", "vmt-")
		if err != nil {
			t.Fatal(err)
		}
		// QEMU's user must reach its run directory (Jail).
		if err := os.Chmod(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		stateDir = filepath.Join(dir, "vms")
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	parent := "dsec-test-" + filepath.Base(filepath.Dir(stateDir))
	cg, err := cgroups.New(context.Background(), cgroups.Options{Parent: parent, Devices: []string{"c 10:232 rwm"}})
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	rt, err := New(context.Background(), Options{
		StateDir: stateDir, CacheDir: kernelCache, Guest: guest, Version: "test",
		Layers:  CacheFiles{Cache: w.cache},
		Logger:  slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Machine: m,
		Jail:    &Jail{UIDBase: testUIDBase, UIDCount: 100, Cgroups: cg},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close(context.Background())
		if ps := qemuProcs(stateDir); len(ps) > 0 {
			t.Errorf("QEMU processes left: %+v", ps)
			for _, p := range ps {
				if pr, err := os.FindProcess(p.Pid); err == nil {
					pr.Kill()
				}
			}
		}
		if entries, _ := os.ReadDir(stateDir); len(entries) > 0 {
			t.Errorf("run directories left: %v", entries)
		}
		if names, _ := cg.List(); len(names) > 0 {
			t.Errorf("cgroups left: %v", names)
			cg.Sweep(context.Background(), nil)
		}
		removeCgroupParent(parent)
	})
	return rt, cg
}

// removeCgroupParent removes a test's cgroup parent from every hierarchy.
func removeCgroupParent(parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	if d := filepath.Join("/sys/fs/cgroup", parent); fileExists(d) {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		os.Remove(d)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// procIDs returns the real uid and gid and the supplementary groups of pid
// (/proc/<pid>/status).
func procIDs(t *testing.T, pid int) (uid, gid, groups string) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), ":")
		switch k {
		case "Uid":
			uid = strings.Fields(v)[0]
		case "Gid":
			gid = strings.Fields(v)[0]
		case "Groups":
			groups = strings.TrimSpace(v)
		}
	}
	return uid, gid, groups
}

// TestVMTierExecFilesDestroy boots one vm-tier sandbox (q35, SeaBIOS,
// PCI virtio) from the busybox image, jailed: it runs a command, writes
// and reads a file, checks QEMU's uid and cgroup, destroys it, and checks
// nothing is left (jailedRuntime's cleanup).
func TestVMTierExecFilesDestroy(t *testing.T) {
	rt, cg := jailedRuntime(t, vmm.Q35, "")
	if rt.Tier() != VMTier {
		t.Fatalf("Tier() = %q, want %q", rt.Tier(), VMTier)
	}
	ctx := ctxT(t, 3*time.Minute)
	start := time.Now()
	sb, err := rt.Create(ctx, busyboxSpec("vm-t1", VMTier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	msb := sb.(*Sandbox)
	t.Logf("create to ready: %v (QEMU pid %d) %+v", time.Since(start).Round(time.Millisecond), msb.Pid(), msb.timing)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			sb.Destroy(context.Background())
		}
	})
	exec := func(argv ...string) string {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: argv}})
		if err != nil {
			t.Fatalf("Exec %q: %v", argv, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("Exec %q: exit %d, stderr %q", argv, res.ExitCode, res.Stderr)
		}
		return res.Stdout
	}
	if out := exec("echo", "hello"); out != "hello\n" {
		t.Errorf("echo: %q", out)
	}
	// The guest sees PCI virtio devices, no virtio-mmio.
	if out := exec("sh", "-c", "ls /sys/bus/pci/drivers/virtio-pci/ | grep -c :"); strings.TrimSpace(out) == "0" {
		t.Errorf("no virtio-pci devices in the guest")
	}
	fs := sb.Files()
	if _, err := fs.Write(ctx, "/tmp/f.txt", strings.NewReader("written"), sandbox.WriteOptions{}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if out := exec("cat", "/tmp/f.txt"); out != "written" {
		t.Errorf("cat after Write: %q", out)
	}
	if rc, _, err := fs.Open(ctx, "/tmp/f.txt"); err != nil {
		t.Errorf("Open: %v", err)
	} else {
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "written" {
			t.Errorf("Open read %q", b)
		}
	}

	// QEMU: its own uid and gid, no supplementary groups, in its cgroup.
	uid, gid, groups := procIDs(t, msb.Pid())
	if uid != strconv.Itoa(testUIDBase) || gid != uid || groups != "" {
		t.Errorf("QEMU runs as uid %s gid %s groups %q, want %d, %d and none", uid, gid, groups, testUIDBase, testUIDBase)
	}
	g, err := cg.Open("vm-t1")
	if err != nil {
		t.Fatalf("the VM's cgroup: %v", err)
	}
	if procs, _ := g.Procs(); len(procs) != 1 || procs[0] != msb.Pid() {
		t.Errorf("cgroup members %v, want QEMU's pid %d", procs, msb.Pid())
	}
	if st, err := g.Stats(); err == nil {
		t.Logf("cgroup: memory %d MiB, pids %d", st.MemoryBytes>>20, st.Pids)
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", "dsec-test-"+filepath.Base(filepath.Dir(rt.opt.StateDir)), "vm-t1", "memory.limit_in_bytes")); err == nil {
		if got, want := strings.TrimSpace(string(b)), strconv.Itoa((256+DefaultOverheadMiB)<<20); got != want {
			t.Errorf("memory limit %s, want %s", got, want)
		}
	}

	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	destroyed = true
	if _, err := os.Stat(msb.RunDir()); !os.IsNotExist(err) {
		t.Errorf("run directory %s after Destroy: %v", msb.RunDir(), err)
	}
	if names, _ := cg.List(); len(names) > 0 {
		t.Errorf("cgroups after Destroy: %v", names)
	}
	if len(rt.uids) != 0 {
		t.Errorf("uids held after Destroy: %v", rt.uids)
	}
}

// TestRecoverSweepsOrphans simulates a node killed between QEMU's start
// and its state file: a jailed microVM is created, its state file
// removed and the runtime closed (its VM left running, as a crash
// would). A new runtime's Recover must kill that QEMU and remove its run
// directory, sockets and cgroup; jailedRuntime's cleanup checks for
// leftovers.
func TestRecoverSweepsOrphans(t *testing.T) {
	rt, cg := jailedRuntime(t, vmm.MicroVM, "")
	ctx := ctxT(t, 3*time.Minute)
	sb, err := rt.Create(ctx, busyboxSpec("mvm-orphan", Tier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	pid := sb.(*Sandbox).Pid()
	dir := sb.(*Sandbox).RunDir()
	if err := os.Remove(filepath.Join(dir, stateFile)); err != nil {
		t.Fatal(err)
	}
	rt.Close(ctx)

	rt2, err := New(ctx, rt.opt)
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close(ctx)
	got, err := rt2.Recover(ctx)
	if err != nil {
		t.Errorf("Recover: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("Recover adopted %d sandboxes, want none", len(got))
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		if argv, _ := cmdline(pid); len(argv) > 0 {
			t.Errorf("QEMU %d still runs after Recover", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("run directory %s after Recover: %v", dir, err)
	}
	if names, _ := cg.List(); len(names) > 0 {
		t.Errorf("cgroups after Recover: %v", names)
	}
}

// TestJailedRecover: a jailed VM survives its runtime's Close and is
// re-adopted, uid, cgroup and upper disk (with what was written) included,
// by a new runtime's Recover; its Destroy then removes everything.
func TestJailedRecover(t *testing.T) {
	rt, cg := jailedRuntime(t, vmm.MicroVM, "")
	ctx := ctxT(t, 3*time.Minute)
	sb, err := rt.Create(ctx, busyboxSpec("mvm-rec", Tier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	// A file on the upper disk: the disk stays with the VM.
	if res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /root/kept"}}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing to the upper: %+v, %v", res, err)
	}
	rt.Close(ctx)
	rt2, err := New(ctx, rt.opt)
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close(ctx)
	got, err := rt2.Recover(ctx)
	if err != nil || len(got) != 1 {
		t.Fatalf("Recover: %d sandboxes, %v", len(got), err)
	}
	res, err := got[0].Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"cat", "/root/kept"}}})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("Exec after Recover: %+v, %v", res, err)
	}
	img := filepath.Join(rt2.opt.StateDir, "mvm-rec", upperFile)
	if _, err := os.Stat(img); err != nil {
		t.Errorf("the upper disk after Recover: %v", err)
	}
	if rt2.uids[testUIDBase] != "mvm-rec" {
		t.Errorf("recovered uids %v", rt2.uids)
	}
	if err := got[0].Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if names, _ := cg.List(); len(names) > 0 {
		t.Errorf("cgroups after Destroy: %v", names)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("the upper disk after Destroy: %v", err)
	}
}

// TestVMConformance runs the tier conformance suite on the vm tier (q35),
// jailed (one TCG boot through SeaBIOS per sandbox: ~2 min in all; -short
// skips it).
func TestVMConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM per sandbox under TCG: skipped in -short mode")
	}
	w := world.get(t)
	sandboxtest.Suite(t, sandboxtest.Factory{
		New: func(t *testing.T, dir string) sandbox.Runtime {
			// Socket paths are limited: a short directory, the same for
			// the same dir (the suite's restart tests reuse it).
			sum := sha256.Sum256([]byte(dir))
			short := filepath.Join(os.TempDir(), "vmc-"+hex.EncodeToString(sum[:6]))
			if err := os.MkdirAll(short, 0o711); err != nil {
				t.Fatal(err)
			}
			os.Chmod(short, 0o711)
			rt, _ := jailedRuntime(t, vmm.Q35, filepath.Join(short, "vms"))
			t.Cleanup(func() { os.RemoveAll(short) })
			return rt
		},
		Image:    sandbox.Image{ID: "busybox", Name: "busybox", Layers: w.layers},
		Commands: busyboxCommands,
	})
}

// BenchmarkCreateVM is BenchmarkCreate's headline figures for the vm tier
// (q35, jailed): create-to-ready p50 and p99 over b.N boots (use
// -benchtime=5x) and QEMU's VmRSS once the guest is ready and idle.
func BenchmarkCreateVM(b *testing.B) {
	rt, _ := jailedRuntime(b, vmm.Q35, "")
	ctx := context.Background()
	prepare(b, rt)
	var ready []time.Duration
	var rss []int64
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		sb, err := rt.Create(ctx, busyboxSpec(fmt.Sprintf("vm-b%d", i), Tier))
		if err != nil {
			b.Fatalf("Create: %v", err)
		}
		ready = append(ready, time.Since(start))
		time.Sleep(500 * time.Millisecond) // idle
		rss = append(rss, vmRSS(sb.(*Sandbox).Pid()))
		b.Logf("create %d: ready %v %+v rss %d MiB", i, ready[len(ready)-1].Round(time.Millisecond), sb.(*Sandbox).timing, rss[len(rss)-1]>>20)
		if err := sb.Destroy(ctx); err != nil {
			b.Fatalf("Destroy: %v", err)
		}
	}
	b.ReportMetric(pct(ready, 50).Seconds(), "s-ready-p50")
	b.ReportMetric(pct(ready, 99).Seconds(), "s-ready-p99")
	var sum int64
	for _, r := range rss {
		sum += r
	}
	b.ReportMetric(float64(sum/int64(len(rss)))/(1<<20), "MiB-rss")
}

// TestVMTierImageKernel: an image whose layers bring a kernel
// (/boot/vmlinuz-<release> with /lib/modules/<release>/) boots it on the
// vm tier. The test's kernel layer holds the node's own kernel and
// modules under another release name, so the VM boots; that it booted
// the image's copy is read from the state file (the kernel's cache entry
// is the image's, img-<sha256>).
func TestVMTierImageKernel(t *testing.T) {
	rt, _ := jailedRuntime(t, vmm.Q35, "")
	ctx := ctxT(t, 3*time.Minute)
	node, err := rt.Prepare(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const release = "6.1.0-dsec-test"
	src := t.TempDir()
	mods := filepath.Join(src, "lib", "modules", release, "kernel")
	if err := os.MkdirAll(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "boot"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(node, filepath.Join(src, "boot", "vmlinuz-"+release))
	kos, _ := filepath.Glob(filepath.Join(filepath.Dir(node), "modules", "*.ko"))
	for _, ko := range kos {
		copyFile(ko, filepath.Join(mods, filepath.Base(ko)))
	}
	a, err := layer.BuildDir(ctx, src, filepath.Join(t.TempDir(), "layer"), layer.BuildOptions{})
	if err != nil {
		t.Fatalf("building the kernel layer: %v", err)
	}
	if err := publish(ctx, world.store, a); err != nil {
		t.Fatal(err)
	}
	layers := append(slices.Clone(world.layers), layerspec.Layer{ID: a.ID(), Manifest: a.Manifest})

	sb, err := rt.Create(ctx, sandbox.Spec{
		ID: "vm-kern", Tier: VMTier, CPU: 1, MemoryMB: 256, DiskMB: 64,
		Image: sandbox.Image{ID: "busybox-kernel", Name: "busybox-kernel", Layers: layers},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer sb.Destroy(context.Background())
	st, err := readState(sb.(*Sandbox).RunDir())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.VM.Kernel, "/img-") || st.VM.Kernel == node {
		t.Errorf("the VM booted %s, want the image's kernel (an img-<sha256> cache entry)", st.VM.Kernel)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"ls", "/boot"}}})
	if err != nil || !strings.Contains(res.Stdout, "vmlinuz-"+release) {
		t.Errorf("ls /boot in the VM: %+v, %v", res, err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestVMTierSystemdInit boots a vm-tier image whose /sbin/init is
// systemd: systemd becomes PID 1, the agent runs beside it, and commands
// and files work. It needs a Debian root with systemd-sysv and an empty
// /dev, named by DSEC_TEST_VM_SYSTEMD_ROOT (debootstrap
// --variant=minbase --include=systemd-sysv bookworm <dir>; rm -rf
// <dir>/dev/*): building one takes a minute and the Debian mirror.
func TestVMTierSystemdInit(t *testing.T) {
	src := os.Getenv("DSEC_TEST_VM_SYSTEMD_ROOT")
	if src == "" {
		t.Skip("set DSEC_TEST_VM_SYSTEMD_ROOT to a Debian root with systemd-sysv (see the test's doc)")
	}
	rt, _ := jailedRuntime(t, vmm.Q35, "")
	ctx := ctxT(t, 5*time.Minute)
	a, err := layer.BuildDir(ctx, src, filepath.Join(t.TempDir(), "layer"), layer.BuildOptions{})
	if err != nil {
		t.Fatalf("building the systemd layer: %v", err)
	}
	if err := publish(ctx, world.store, a); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sb, err := rt.Create(ctx, sandbox.Spec{
		ID: "vm-systemd", Tier: VMTier, CPU: 1, MemoryMB: 512, DiskMB: 128,
		Image: sandbox.Image{ID: "debian-systemd", Name: "debian-systemd", Layers: []layerspec.Layer{{ID: a.ID(), Manifest: a.Manifest}}},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Logf("create to ready: %v", time.Since(start).Round(time.Millisecond))
	defer sb.Destroy(context.Background())
	run := func(argv ...string) string {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: argv}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Exec %q: %+v, %v", argv, res, err)
		}
		return res.Stdout
	}
	if got := strings.TrimSpace(run("cat", "/proc/1/comm")); got != "systemd" {
		t.Errorf("PID 1 is %q, want systemd", got)
	}
	if _, err := sb.Files().Write(ctx, "/root/note", strings.NewReader("under systemd"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := run("cat", "/root/note"); got != "under systemd" {
		t.Errorf("cat: %q", got)
	}
	// How long systemd takes to finish booting (for the log; "degraded"
	// is normal in a VM without the units' hardware).
	for {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"systemctl", "is-system-running"}}})
		if err != nil {
			t.Fatalf("Exec systemctl: %v", err)
		}
		state := strings.TrimSpace(res.Stdout)
		// Until "running" or "degraded" ("offline" or nothing: its bus is
		// not up yet).
		if state == "running" || state == "degraded" || state == "maintenance" || time.Since(start) > 90*time.Second {
			t.Logf("systemd %q %v after the create started", state, time.Since(start).Round(100*time.Millisecond))
			if state != "running" && state != "degraded" {
				res, _ := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sh", "-c", "systemctl --failed --no-pager 2>&1 | head; dmesg | tail -20"}}})
				t.Logf("%s", res.Stdout)
			}
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}
