package vmkernel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/vminit"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// testCache is shared by every test binary of a run (and kept across
// runs): the kernel is fetched once per machine and package version.
var testCache = filepath.Join(os.TempDir(), "dsec-test-vmkernel")

// bootWatchdog kills a test VM that has not powered off by then (a hung
// TCG boot was seen on this kind of host).
const bootWatchdog = 30 * time.Second

var testKernel struct {
	once   sync.Once
	k      Kernel
	initrd string
	took   time.Duration
	err    error
}

// kernelForTest returns the cached guest kernel and an initramfs with the
// guest binary, fetching and building them once per test binary. It skips
// without QEMU and fails when the kernel cannot be fetched (the Debian
// mirror is needed the first time).
func kernelForTest(t testing.TB) (Kernel, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM under TCG: skipped in -short mode")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skipf("could not find qemu-system-x86_64 (Debian qemu-system-x86): %v", err)
	}
	d := &testKernel
	d.once.Do(func() {
		start := time.Now()
		d.k, d.err = Fetch(context.Background(), testCache, slog.New(slog.DiscardHandler))
		d.took = time.Since(start)
		if d.err != nil {
			return
		}
		var guest []byte
		if guest, d.err = builtin.GuestBinary("test"); d.err != nil {
			return
		}
		if !bytes.Contains(guest, []byte(vminit.ReadyPrefix)) {
			d.err = errStaleGuest
			return
		}
		d.initrd, d.err = Initramfs(testCache, d.k, guest)
	})
	if d.err != nil {
		t.Fatalf("guest kernel and initramfs (the first fetch needs the Debian mirror): %v", d.err)
	}
	t.Logf("kernel %s %s (%s, %d modules) in %s", d.k.Package, d.k.Version, d.k.Release, len(d.k.Modules), d.took.Round(time.Millisecond))
	return d.k, d.initrd
}

var errStaleGuest = errors.New("the embedded dsec-guest predates its VM init mode: run `make build`")

// bootResult is what one boot of the test VM showed.
type bootResult struct {
	serialReady time.Duration // from spawn to the ready line on ttyS0
	hvcReady    time.Duration // … on the virtio console
	exited      time.Duration // … to QEMU's exit after the guest's poweroff
	readyLine   string
	maxRSS      int64 // QEMU's peak RSS, bytes
}

// bootVM boots kernel k with initrd under QEMU's microvm machine (TCG)
// with dsec.test=poweroff and a virtio console on a unix socket, and
// returns when QEMU has exited; a boot that takes longer than
// bootWatchdog is killed and fails the test.
func bootVM(t testing.TB, k Kernel, initrd string) bootResult {
	t.Helper()
	dir, err := os.MkdirTemp("", "dsec-vm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "hvc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	cmdline := Cmdline(true, vminit.TestParam+"=poweroff")
	ctx, cancel := context.WithTimeout(context.Background(), bootWatchdog)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-M", "microvm", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "stdio",
		"-kernel", k.VmlinuxPath(), "-initrd", initrd,
		"-append", cmdline,
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=c0,path="+sock,
		"-device", "virtconsole,chardev=c0")
	cmd.Stdin = nil
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting QEMU: %v", err)
	}

	var r bootResult
	var serial bytes.Buffer
	serialDone := make(chan struct{})
	go func() { // the serial console, until QEMU exits
		defer close(serialDone)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			line := strings.TrimSpace(s.Text())
			if serial.Len() < 64<<10 {
				serial.WriteString(line + "\n")
			}
			if r.serialReady == 0 && strings.HasPrefix(line, vminit.ReadyPrefix) {
				r.serialReady, r.readyLine = time.Since(start), line
			}
		}
	}()
	hvcDone := make(chan time.Duration, 1)
	go func() { // the virtio console: QEMU connects at start-up
		c, err := ln.Accept()
		if err != nil {
			hvcDone <- 0
			return
		}
		defer c.Close()
		s := bufio.NewScanner(c)
		for s.Scan() {
			if strings.HasPrefix(strings.TrimSpace(s.Text()), vminit.ReadyPrefix) {
				hvcDone <- time.Since(start)
				return
			}
		}
		hvcDone <- 0
	}()

	testenv.Recv(t, serialDone, 5*time.Minute, "the guest's serial console to close")
	werr := testenv.WaitCmd(t, cmd, 5*time.Minute, "QEMU to exit")
	r.exited = time.Since(start)
	ln.Close()
	r.hvcReady = testenv.Recv(t, hvcDone, time.Minute, "the virtio console reader")
	if ctx.Err() != nil {
		t.Fatalf("boot watchdog: QEMU killed after %s\nserial:\n%s\nstderr: %s", bootWatchdog, serial.String(), stderr.String())
	}
	if werr != nil {
		t.Fatalf("QEMU: %v\nserial:\n%s\nstderr: %s", werr, serial.String(), stderr.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSS = ru.Maxrss << 10
	}
	if r.serialReady == 0 {
		t.Fatalf("no %s line on the serial console\nserial:\n%s\nstderr: %s", vminit.ReadyPrefix, serial.String(), stderr.String())
	}
	if r.hvcReady == 0 {
		t.Fatalf("no %s line on the virtio console\nserial:\n%s", vminit.ReadyPrefix, serial.String())
	}
	return r
}

func TestBootMicroVM(t *testing.T) {
	k, initrd := kernelForTest(t)
	r := bootVM(t, k, initrd)
	t.Logf("%s: ready on ttyS0 %s, hvc0 %s, QEMU exited %s, max RSS %d MiB",
		r.readyLine, r.serialReady.Round(time.Millisecond), r.hvcReady.Round(time.Millisecond),
		r.exited.Round(time.Millisecond), r.maxRSS>>20)
	// The test VM has no network card, no PCI bus and no upper disk: the
	// network's, the PCI transport's and ext4's modules are skipped.
	want := 0
	for _, m := range k.Modules {
		if _, ok := vminit.DeviceModules[m.Name]; !ok && !vminit.PCIModules[m.Name] && !vminit.UpperModules[m.Name] {
			want++
		}
	}
	if !strings.Contains(r.readyLine, fmt.Sprintf("modules=%d/", want)) {
		t.Errorf("ready line %q: want %d modules loaded (all but the network's, PCI's and ext4's)", r.readyLine, want)
	}
}

// BenchmarkBootTCG boots the test VM b.N times (use -benchtime=5x) and
// reports boot-to-ready p50 on the serial console and QEMU's peak RSS.
func BenchmarkBootTCG(b *testing.B) {
	k, initrd := kernelForTest(b)
	var ready, exited []time.Duration
	var rss int64
	for b.Loop() {
		r := bootVM(b, k, initrd)
		ready = append(ready, r.serialReady)
		exited = append(exited, r.exited)
		rss = max(rss, r.maxRSS)
	}
	slices.Sort(ready)
	slices.Sort(exited)
	b.ReportMetric(ready[len(ready)/2].Seconds(), "s-ready-p50")
	b.ReportMetric(ready[len(ready)-1].Seconds(), "s-ready-max")
	b.ReportMetric(exited[len(exited)/2].Seconds(), "s-exit-p50")
	b.ReportMetric(float64(rss)/(1<<20), "MiB-maxrss")
}

// TestInitramfsReproducible builds the real initramfs again, twice and
// concurrently, into a fresh cache directory: each equals the cached one
// byte for byte, and no temporary file is left.
func TestInitramfsReproducible(t *testing.T) {
	k, cached := kernelForTest(t)
	guest, err := builtin.GuestBinary("test")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(cached)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var wg sync.WaitGroup
	paths := make([]string, 2)
	errs := make([]error, 2)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = Initramfs(dir, k, guest) })
	}
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the concurrent Initramfs builds")
	for i, p := range paths {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if filepath.Base(p) != filepath.Base(cached) {
			t.Errorf("initramfs key %s, the cached one %s", filepath.Base(p), filepath.Base(cached))
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("initramfs built again differs from the cached one (%d vs %d bytes)", len(got), len(want))
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "initramfs"))
	if len(entries) != 1 {
		t.Errorf("initramfs cache holds %d files, want 1", len(entries))
	}
	names, files := readCpio(t, want)
	if f := files["init"]; f.Mode != cpioReg|0o755 || !bytes.Equal([]byte(f.Data), guest) {
		t.Errorf("/init is not the guest binary (mode %o, %d bytes)", f.Mode, len(f.Data))
	}
	list := files[vminit.ModulesList[1:]].Data
	for _, m := range k.Modules {
		if !strings.Contains(list, "/"+m.Name+".ko\n") {
			t.Errorf("%s does not list %s", vminit.ModulesList, m.Name)
		}
	}
	t.Logf("initramfs %d KiB, %d entries", len(want)>>10, len(names))
}

// TestFetchCached checks that Fetch finds the cached kernel again, from
// several goroutines at once.
func TestFetchCached(t *testing.T) {
	k, _ := kernelForTest(t)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			got, err := Fetch(context.Background(), testCache, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Error(err)
				return
			}
			if got.Dir != k.Dir || got.Vmlinux != k.Vmlinux {
				t.Errorf("second Fetch gave %s, want the cached %s", got.Dir, k.Dir)
			}
		})
	}
	testenv.WaitGroup(t, &wg, 10*time.Minute, "the concurrent Fetches")
}

// TestResolveRecent checks that a resolution is reused for a while: a
// node's start resolves once for both VM tiers.
func TestResolveRecent(t *testing.T) {
	lastResolve.mu.Lock()
	lastResolve.at = time.Time{}
	lastResolve.mu.Unlock()
	ctx := context.Background()
	first, err := resolveRecent(ctx)
	if errors.Is(err, errdefs.ErrNotSupported) {
		t.Skipf("no apt here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	at := lastResolve.at
	again, err := resolveRecent(ctx)
	if err != nil || again != first || !lastResolve.at.Equal(at) {
		t.Errorf("second resolution: %+v at %v, %v; want %+v reused from %v", again, lastResolve.at, err, first, at)
	}
}
