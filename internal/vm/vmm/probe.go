package vmm

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// probeGuest is a 4.7 KiB PVH kernel (source and build command in
// probe/pvh.S) that goes from 32-bit protected mode to long mode, checks
// RAM and exits QEMU with status probeOK through isa-debug-exit.
//
//go:embed probe/pvh.elf
var probeGuest []byte

// probeOK is QEMU's exit status when the probe guest wrote 0x2a to
// isa-debug-exit: 0x2a<<1 | 1.
const probeOK = 85

// Probe time limits. A working KVM runs the stub in about 50 ms and boots a
// kernel to its panic in well under a second; this host's /dev/kvm (PVM
// only) runs the stub but a Linux boot never prints a line.
const (
	stubTimeout   = 3 * time.Second
	kernelTimeout = 8 * time.Second
)

var probeCache struct {
	mu sync.Mutex // guards following fields
	m  map[probeKey]error
}

type probeKey struct{ binary, kernel string }

// ProbeAccel returns the accelerator VMs on this host should use: AccelKVM
// if KVMUsable(ctx, binary, kernel) succeeds, else AccelTCG. It fails only
// if QEMU itself cannot run (then neither can any VM).
func ProbeAccel(ctx context.Context, binary, kernel string) (string, error) {
	err := KVMUsable(ctx, binary, kernel)
	switch {
	case err == nil:
		return AccelKVM, nil
	case errors.Is(err, errdefs.ErrNotSupported):
		return AccelTCG, nil
	}
	return "", err
}

// KVMUsable reports whether guests actually run on /dev/kvm; the answer is
// cached per (binary, kernel) once decided. binary is the QEMU executable
// ("" for qemu-system-x86_64); kernel is a guest kernel (a PVH vmlinux: the
// one the microvm tier boots) for the decisive stage. Without it the answer
// is no: KVM is used only once a real kernel was seen booting on it.
//
// The probe has three stages, cheapest first:
//
//  1. /dev/kvm exists and opens read-write;
//  2. a stub guest (probe/pvh.S) boots on a KVM microvm through the same
//     firmware path as Linux (qboot, then PVH entry), enters long mode and
//     exits QEMU through isa-debug-exit: KVM really runs guest code, in the
//     modes Linux uses;
//  3. the guest kernel boots on a KVM microvm without a root
//     file system and must reach its "Kernel panic" (panic=-1 then resets,
//     and -no-reboot exits QEMU) within 8 s: proof that a real kernel gets
//     through early boot (timers, interrupts, CPU features). A host whose
//     KVM only runs PVM guests passes stage 2 but hangs here.
//
// query-kvm is not used: it only says that QEMU opened /dev/kvm.
//
// It returns nil, or an error wrapping errdefs.ErrNotSupported saying which
// stage failed, or another error if the stub cannot even run on TCG (QEMU
// is missing or broken) or ctx ended.
func KVMUsable(ctx context.Context, binary, kernel string) error {
	key := probeKey{binary, kernel}
	probeCache.mu.Lock()
	defer probeCache.mu.Unlock()
	if err, ok := probeCache.m[key]; ok {
		return err
	}
	err := probeKVM(ctx, binary, kernel)
	if ctx.Err() == nil {
		if probeCache.m == nil {
			probeCache.m = make(map[probeKey]error)
		}
		probeCache.m[key] = err
	}
	return err
}

func probeKVM(ctx context.Context, binary, kernel string) error {
	if binary == "" {
		binary = "qemu-system-x86_64"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("kvm: opening /dev/kvm: %w: %w", err, errdefs.ErrNotSupported)
	}
	f.Close()
	dir, err := os.MkdirTemp("", "dsec-kvm-probe-")
	if err != nil {
		return fmt.Errorf("kvm probe: %w", err)
	}
	defer os.RemoveAll(dir)
	stub := filepath.Join(dir, "pvh.elf")
	if err := os.WriteFile(stub, probeGuest, 0o644); err != nil {
		return fmt.Errorf("kvm probe: %w", err)
	}
	if err := runProbe(ctx, binary, AccelKVM, stub, stubTimeout); err != nil {
		if ctx.Err() != nil {
			return err
		}
		// Is QEMU itself able to run the stub? Then KVM is at fault.
		if terr := runProbe(ctx, binary, AccelTCG, stub, stubTimeout); terr != nil {
			return fmt.Errorf("kvm probe: the probe guest fails on tcg too: %w", terr)
		}
		return fmt.Errorf("kvm: the probe guest does not run: %w: %w", err, errdefs.ErrNotSupported)
	}
	if kernel == "" {
		return fmt.Errorf("kvm: the probe guest runs, but no guest kernel was given to prove that Linux boots: %w", errdefs.ErrNotSupported)
	}
	if err := runKernelProbe(ctx, binary, AccelKVM, kernel, kernelTimeout); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("kvm: %s does not boot: %w: %w", kernel, err, errdefs.ErrNotSupported)
	}
	return nil
}

// probeArgs is the common command line of probe VMs.
func probeArgs(accel string, memMiB int) []string {
	a := []string{"-M", "microvm", "-accel", accel, "-m", strconv.Itoa(memMiB), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-sandbox", SandboxFlags}
	if accel == AccelKVM {
		a = append(a, "-cpu", "host")
	}
	return a
}

// runProbe runs the stub guest on accel and checks its exit status.
func runProbe(ctx context.Context, binary, accel, stub string, timeout time.Duration) error {
	args := append(probeArgs(accel, 64), "-kernel", stub, "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04")
	_, code, err := runBounded(ctx, binary, args, timeout)
	if err != nil {
		return err
	}
	if code != probeOK {
		return fmt.Errorf("qemu exited with status %d, want %d", code, probeOK)
	}
	return nil
}

// runKernelProbe boots kernel on accel until it panics for want of a root
// file system.
func runKernelProbe(ctx context.Context, binary, accel, kernel string, timeout time.Duration) error {
	// 256 MiB: the Debian kernel hangs silently in 64.
	args := append(probeArgs(accel, 256), "-serial", "stdio", "-kernel", kernel,
		"-append", "console=ttyS0 panic=-1 root=/dev/dsec-none")
	out, _, err := runBounded(ctx, binary, args, timeout)
	if err != nil {
		return err
	}
	if !bytes.Contains(out, []byte("Kernel panic")) {
		return fmt.Errorf("the kernel stopped without its panic; console ends with %q", tail(out, 300))
	}
	return nil
}

// runBounded runs QEMU, killing it after timeout, and returns the end of
// its output and its exit status.
func runBounded(ctx context.Context, binary string, args []string, timeout time.Duration) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := &tailBuffer{max: 64 << 10}
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = probeProcAttr()
	cmd.WaitDelay = time.Second
	runtime.LockOSThread() // see probeProcAttr
	err := cmd.Run()
	runtime.UnlockOSThread()
	if ctx.Err() != nil {
		return nil, 0, fmt.Errorf("no exit within %v (output ends with %q): %w", timeout, tail([]byte(out.String()), 300), ctx.Err())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		return []byte(out.String()), ee.ExitCode(), nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("running %s: %w (%s)", binary, err, tail([]byte(out.String()), 300))
	}
	return []byte(out.String()), 0, nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
