package vmm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// requireQEMU skips t if QEMU is not installed, and checks when t ends
// that no QEMU of its run directory is left and no socket remains.
func requireQEMU(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skipf("qemu-system-x86_64 not installed (scripts/deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		for _, p := range qemuProcs(dir) {
			t.Errorf("left behind: %s", p)
			syscallKill(p.Pid)
		}
		for _, s := range []string{QMPSocket, AgentSocket, SerialSocket} {
			if _, err := os.Lstat(filepath.Join(dir, s)); err == nil {
				t.Errorf("left behind: socket %s", s)
			}
		}
	})
	return dir
}

// qemuProcs lists the processes whose command line names dir (zombies
// included: a process nobody reaps is a leak too).
func qemuProcs(dir string) []testenv.Proc {
	var out []testenv.Proc
	for _, p := range testenv.Procs() {
		if strings.Contains(p.Cmdline, dir) || p.State == 'Z' && strings.Contains(p.Cmdline, "qemu") {
			out = append(out, p)
		}
	}
	return out
}

func syscallKill(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}

func pausedConfig(dir string) Config {
	return Config{Name: "t", Machine: MicroVM, CPUs: 1, MemoryMiB: 64, RunDir: dir, Paused: true, Agent: true}
}

func wantCode(t *testing.T, err error, class errdefs.Class, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s/%s", class, code)
	}
	if errdefs.ClassOf(err) != class || errdefs.CodeOf(err) != code {
		t.Fatalf("got %s/%s (%v), want %s/%s", errdefs.ClassOf(err), errdefs.CodeOf(err), err, class, code)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestStartStatusShutdown(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	vm, err := Start(ctx, pausedConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	st, err := vm.Status(ctx)
	if err != nil || st.Status != "prelaunch" || st.Running {
		t.Fatalf("status %+v, %v; want prelaunch", st, err)
	}
	kvm, err := vm.QMP().QueryKVM(ctx)
	if err != nil || kvm.Enabled {
		t.Fatalf("query-kvm %+v, %v; want disabled (tcg)", kvm, err)
	}
	if _, err := os.Stat(vm.AgentSocket()); err != nil {
		t.Fatalf("agent socket: %v", err)
	}
	// Commands from several goroutines at once each get their own reply.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if st, err := vm.Status(ctx); err != nil || st.Status != "prelaunch" {
					t.Errorf("concurrent status %+v, %v", st, err)
					return
				}
			}
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent QMP commands")
	if err := vm.QMP().Execute(ctx, "no-such-command", nil, nil); !errors.As(err, new(*QMPError)) {
		t.Fatalf("unknown command: %v, want a *QMPError", err)
	}
	if err := vm.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if ps := vm.ProcessState(); ps == nil || !ps.Exited() {
		t.Fatalf("process state %v: want a clean exit (quit)", ps)
	}
	if _, err := vm.Status(ctx); !errors.Is(err, ErrQMPClosed) {
		t.Fatalf("status after shutdown: %v", err)
	}
}

func TestRunningShutdownAndEvents(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	cfg := pausedConfig(dir)
	cfg.ShutdownGrace = 100 * time.Millisecond
	vm, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	q := vm.QMP()
	if err := q.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, q, "RESUME"); ev.Time.IsZero() {
		t.Errorf("event without a time: %+v", ev)
	}
	// qboot finds nothing to boot; the guest never powers off, so the
	// power button times out and quit follows.
	if err := vm.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func nextEvent(t *testing.T, q *QMP, name string) Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev, ok := <-q.Events():
			if !ok {
				t.Fatalf("events closed before %s", name)
			}
			if ev.Name == name {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event", name)
		}
	}
}

func TestWatchdogKillsUnreadyVM(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	vm, err := Start(ctx, pausedConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = vm.WaitReady(ctx, func(ctx context.Context) error {
		// bounded: WaitReady's context has the test's deadline
		<-ctx.Done() // a paused guest never gets ready
		return ctx.Err()
	}, 300*time.Millisecond)
	wantCode(t, err, errdefs.DeadlineExceeded, CodeBootTimeout)
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("the watchdog took %v", d)
	}
	select {
	case <-vm.Done():
	default:
		t.Fatal("the VM outlived its watchdog")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the run directory: %v", ents)
	}
}

func TestWaitReady(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	vm, err := Start(ctx, pausedConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	// Ready at once: the VM stays.
	if err := vm.WaitReady(ctx, func(context.Context) error { return nil }, time.Second); err != nil {
		t.Fatal(err)
	}
	// The VM exits while the check waits: boot_failed, not a timeout.
	err = vm.WaitReady(ctx, func(ctx context.Context) error {
		vm.QMP().Execute(ctx, "quit", nil, nil)
		// bounded: WaitReady's context has the test's deadline
		<-ctx.Done()
		return ctx.Err()
	}, 10*time.Second)
	wantCode(t, err, errdefs.Unavailable, CodeBootFailed)
	if _, err := os.Stat(vm.SerialLog()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serial log after a failed boot: %v", err)
	}
}

func TestKill(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	vm, err := Start(ctx, pausedConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if ps := vm.ProcessState(); ps == nil || ps.Exited() {
		t.Fatalf("process state %v: want killed by a signal", ps)
	}
	if err := vm.Kill(ctx); err != nil {
		t.Fatalf("a second kill: %v", err)
	}
}

// TestAdopt drops a VM's handle as a node service restart would and takes
// the VM back by pid.
func TestAdopt(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	cfg := pausedConfig(dir)
	vm, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.cmd.Process.Kill() })
	pid := vm.Pid
	vm.Release()
	if vm.QMP() != nil {
		t.Fatal("a released handle still has QMP")
	}

	// Another process, or a gone one, is refused.
	_, err = Adopt(ctx, cfg, os.Getpid())
	wantCode(t, err, errdefs.Conflict, CodeAdoptMismatch)
	other := pausedConfig(t.TempDir())
	_, err = Adopt(ctx, other, pid)
	wantCode(t, err, errdefs.Conflict, CodeAdoptMismatch)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	_, err = Adopt(ctx, cfg, gone.Process.Pid)
	wantCode(t, err, errdefs.NotFound, CodeNotFound)

	a, err := Adopt(ctx, cfg, pid)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := a.Status(ctx); err != nil || st.Status != "prelaunch" {
		t.Fatalf("adopted status %+v, %v", st, err)
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// The first handle's reaper collects the exit (the old agent's parent,
	// init, would).
	if err := vm.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx := ctxT(t, 20*time.Second)
	cfg := pausedConfig(dir)
	cfg.Disks = []Disk{{Path: filepath.Join(dir, "missing.img")}}
	_, err := Start(ctx, cfg)
	wantCode(t, err, errdefs.Unavailable, CodeStartFailed)
	if !strings.Contains(err.Error(), "missing.img") {
		t.Errorf("the error does not quote qemu: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the run directory: %v", ents)
	}
	// A run directory with a live VM's socket is refused.
	os.WriteFile(filepath.Join(dir, QMPSocket), nil, 0o600)
	_, err = Start(ctx, pausedConfig(dir))
	wantCode(t, err, errdefs.Conflict, CodeRunDirBusy)
	os.Remove(filepath.Join(dir, QMPSocket))
}

func TestStartCancelled(t *testing.T) {
	t.Parallel()
	dir := requireQEMU(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Start(ctx, pausedConfig(dir)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the run directory: %v", ents)
	}
}

func TestProbeGuestRunsOnTCG(t *testing.T) {
	t.Parallel()
	requireQEMU(t)
	dir := t.TempDir()
	stub := filepath.Join(dir, "pvh.elf")
	if err := os.WriteFile(stub, probeGuest, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runProbe(ctxT(t, 10*time.Second), "qemu-system-x86_64", AccelTCG, stub, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestProbeAccel needs a guest kernel (a PVH vmlinux) in
// DSEC_TEST_VMLINUX; on a host whose /dev/kvm does not boot it, it costs
// the kernel stage's 8 s timeout.
func TestProbeAccel(t *testing.T) {
	// Not parallel: two TCG kernel boots at once on this 2-core host can
	// hang (see TestBootGuest).
	requireQEMU(t)
	kernel := os.Getenv("DSEC_TEST_VMLINUX")
	if kernel == "" {
		t.Skip("DSEC_TEST_VMLINUX (a guest vmlinux) not set")
	}
	ctx := ctxT(t, 30*time.Second)
	if err := runKernelProbe(ctx, "qemu-system-x86_64", AccelTCG, kernel, 20*time.Second); err != nil {
		t.Fatalf("the kernel probe fails on tcg: %v", err)
	}
	accel, err := ProbeAccel(ctx, "", kernel)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accelerator: %s (%v)", accel, KVMUsable(ctx, "", kernel))
	if _, err := os.Stat("/dev/kvm"); err != nil && accel != AccelTCG {
		t.Fatalf("no /dev/kvm but accelerator %s", accel)
	}
	if again, _ := ProbeAccel(ctx, "", kernel); again != accel {
		t.Fatalf("cached answer %s, first %s", again, accel)
	}
	if a, _ := ProbeAccel(ctx, "", ""); a != AccelTCG {
		t.Fatalf("without a kernel: %s, want tcg", a)
	}
}

// TestProbeGuestSource rebuilds probe/pvh.elf from probe/pvh.S and checks
// that the embedded binary is what the source gives.
func TestProbeGuestSource(t *testing.T) {
	for _, tool := range []string{"as", "ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s (binutils) not installed: %v", tool, err)
		}
	}
	dir := t.TempDir()
	obj, elf := filepath.Join(dir, "pvh.o"), filepath.Join(dir, "pvh.elf")
	for _, c := range [][]string{
		{"as", "--64", "-o", obj, "probe/pvh.S"},
		{"ld", "-m", "elf_x86_64", "-Ttext=0x100000", "-z", "noexecstack", "--build-id=none", "-s", "-o", elf, obj},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	b, err := os.ReadFile(elf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, probeGuest) {
		t.Errorf("probe/pvh.elf (%d bytes) is not what probe/pvh.S builds (%d bytes): rebuild it", len(probeGuest), len(b))
	}
}

// TestBootGuest boots the guest kernel and initramfs of internal/vm/vmkernel
// (paths in DSEC_TEST_VMLINUX and DSEC_TEST_INITRD) in the init's test mode:
// it prints its ready line on the console, then powers off. Under CPU
// contention (two such boots at once here) the kernel was seen to fail its
// PIT calibration ("tsc: Unable to calibrate against PIT … Marking TSC
// unstable") and hang: the hang WaitReady exists for.
func TestBootGuest(t *testing.T) {
	// Not parallel: two TCG kernel boots at once on this 2-core host can
	// hang (see TestBootGuest).
	dir := requireQEMU(t)
	kernel, initrd := os.Getenv("DSEC_TEST_VMLINUX"), os.Getenv("DSEC_TEST_INITRD")
	if kernel == "" || initrd == "" {
		t.Skip("DSEC_TEST_VMLINUX and DSEC_TEST_INITRD (the guest kernel and initramfs) not set")
	}
	ctx := ctxT(t, 30*time.Second)
	vm, err := Start(ctx, Config{
		Name: "boot", Machine: MicroVM, CPUs: 1, MemoryMiB: 256, RunDir: dir,
		Kernel: kernel, Initrd: initrd, Cmdline: "console=ttyS0 quiet panic=-1 dsec.test=poweroff",
		Agent: true, AgentConsole: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = vm.WaitReady(ctx, func(ctx context.Context) error {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		// The test-mode guest powers off some 30 ms after its ready line:
		// look once more when the VM's exit (its console drained) ends ctx.
		for {
			done := ctx.Err() != nil
			if strings.Contains(logTail(vm.SerialLog(), 1<<16), "DSEC-READY") {
				return nil
			}
			if done {
				return ctx.Err()
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ready after %v", time.Since(began).Round(time.Millisecond))
	if err := vm.Wait(ctx); err != nil {
		t.Fatalf("the guest did not power off: %v", err)
	}
	if ps := vm.ProcessState(); ps == nil || ps.ExitCode() != 0 {
		t.Fatalf("qemu exit %v", ps)
	}
}
