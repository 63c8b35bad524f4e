//go:build linux && amd64

package seccomp

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/elastic/go-seccomp-bpf/arch"
)

// The test binary re-executes itself as a probe (probeEnv set): it
// installs the filter (or not, for the control run), makes each probe's
// syscall and prints the errnos as JSON.
const probeEnv = "DSEC_SECCOMP_PROBE"

func TestMain(m *testing.M) {
	if mode := os.Getenv(probeEnv); mode != "" {
		os.Exit(runProbe(mode))
	}
	os.Exit(m.Run())
}

// probe makes one syscall (or a few) and returns its errno, 0 for success.
type probe struct {
	name string
	fn   func(dir string) syscall.Errno
	// denied is the errno the filter returns; 0 means the call is allowed
	// and must behave exactly as without the filter.
	denied syscall.Errno
}

func sysnr(name string) uintptr { return uintptr(arch.X86_64.SyscallNames[name]) }

func raw(name string, args ...uintptr) syscall.Errno {
	var a [6]uintptr
	copy(a[:], args)
	r, _, e := syscall.Syscall6(sysnr(name), a[0], a[1], a[2], a[3], a[4], a[5])
	if e == 0 && (name == "perf_event_open" || name == "userfaultfd" || name == "io_uring_setup" || name == "socket") {
		syscall.Close(int(r))
	}
	return e
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO // not a syscall failure: stands out in a mismatch
}

func cstr(s string) uintptr {
	p, _ := syscall.BytePtrFromString(s)
	return uintptr(unsafe.Pointer(p))
}

var probes = []probe{
	// Allowed: the same result with and without the filter.
	{"read", func(string) syscall.Errno { _, err := os.ReadFile("/proc/self/status"); return errnoOf(err) }, 0},
	{"open+write", func(dir string) syscall.Errno {
		return errnoOf(os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
	}, 0},
	{"mmap", func(string) syscall.Errno {
		b, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err == nil {
			b[0] = 1
			err = syscall.Munmap(b)
		}
		return errnoOf(err)
	}, 0},
	{"threads", func(string) syscall.Errno {
		// Locked goroutines force the runtime to clone new threads.
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				_ = syscall.Getpid()
			}()
		}
		// bounded: the goroutines only lock a thread and return
		wg.Wait()
		return 0
	}, 0},
	{"fork+execve /bin/true", func(string) syscall.Errno { return errnoOf(exec.Command("/bin/true").Run()) }, 0},
	{"socket AF_INET", func(string) syscall.Errno { return raw("socket", syscall.AF_INET, syscall.SOCK_STREAM, 0) }, 0},
	{"socket AF_NETLINK", func(string) syscall.Errno {
		return raw("socket", syscall.AF_NETLINK, syscall.SOCK_RAW, syscall.NETLINK_ROUTE)
	}, 0},
	{"personality query", func(string) syscall.Errno { return raw("personality", 0xffffffff) }, 0},
	{"ptrace PEEKUSER of a non-tracee", func(string) syscall.Errno {
		return raw("ptrace", syscall.PTRACE_PEEKUSR, uintptr(os.Getppid()), 0, 0)
	}, 0},
	{"clone CLONE_THREAD alone (EINVAL)", func(string) syscall.Errno { return raw("clone", syscall.CLONE_THREAD) }, 0},

	// Denied.
	{"mount tmpfs", func(dir string) syscall.Errno {
		e := raw("mount", cstr("none"), cstr(dir), cstr("tmpfs"), 0, 0)
		if e == 0 {
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
		return e
	}, syscall.EPERM},
	{"umount2", func(dir string) syscall.Errno { return raw("umount2", cstr(dir), 0) }, syscall.EPERM},
	{"unshare CLONE_NEWUTS", func(string) syscall.Errno { return raw("unshare", syscall.CLONE_NEWUTS) }, syscall.EPERM},
	{"unshare CLONE_NEWUSER", func(string) syscall.Errno { return raw("unshare", syscall.CLONE_NEWUSER) }, syscall.EPERM},
	{"clone CLONE_NEWUSER|CLONE_FS", func(string) syscall.Errno {
		return raw("clone", syscall.CLONE_NEWUSER|syscall.CLONE_FS)
	}, syscall.EPERM},
	{"clone3", func(string) syscall.Errno { return raw("clone3", 0, 0) }, syscall.ENOSYS},
	{"keyctl", func(string) syscall.Errno { return raw("keyctl", 0, ^uintptr(2), 0) }, syscall.EPERM}, // GET_KEYRING_ID, SESSION
	{"bpf", func(string) syscall.Errno {
		attr := make([]byte, 16)
		return raw("bpf", 12, uintptr(unsafe.Pointer(&attr[0])), 16) // BPF_MAP_GET_NEXT_ID
	}, syscall.EPERM},
	{"perf_event_open", func(string) syscall.Errno {
		attr := make([]byte, 128)
		binary.NativeEndian.PutUint32(attr[0:], 1)     // PERF_TYPE_SOFTWARE, config 0 = CPU clock
		binary.NativeEndian.PutUint32(attr[4:], 128)   // size
		binary.NativeEndian.PutUint64(attr[40:], 1<<5) // exclude_kernel
		return raw("perf_event_open", uintptr(unsafe.Pointer(&attr[0])), 0, ^uintptr(0), ^uintptr(0), 0)
	}, syscall.EPERM},
	{"userfaultfd", func(string) syscall.Errno { return raw("userfaultfd", syscall.O_CLOEXEC) }, syscall.EPERM},
	{"io_uring_setup", func(string) syscall.Errno {
		params := make([]byte, 120)
		return raw("io_uring_setup", 1, uintptr(unsafe.Pointer(&params[0])))
	}, syscall.EPERM},
	{"init_module", func(string) syscall.Errno { return raw("init_module", 0, 0, cstr("")) }, syscall.EPERM},
	{"kexec_load", func(string) syscall.Errno { return raw("kexec_load", 0, 0, 0, 0x0f00) }, syscall.EPERM},
	{"personality ADDR_NO_RANDOMIZE", func(string) syscall.Errno { return raw("personality", 0x0040000) }, syscall.EPERM},
	{"socket AF_VSOCK", func(string) syscall.Errno { return raw("socket", 40, syscall.SOCK_STREAM, 0) }, syscall.EPERM},
	{"file_getattr (468, newer than the table)", func(string) syscall.Errno {
		_, _, e := syscall.Syscall6(468, ^uintptr(0), 0, 0, 0, 0, 0)
		return e
	}, syscall.ENOSYS},
	{"open_by_handle_at", func(string) syscall.Errno { return raw("open_by_handle_at", ^uintptr(0), 0, 0) }, syscall.EPERM},
}

// probeReport is what a probe process prints.
type probeReport struct {
	Errnos     map[string]int
	Seccomp    []string // the Seccomp: line of every thread
	NoNewPrivs []string
}

func runProbe(mode string) int {
	switch mode {
	case "filter", "i386", "x32", "cost-filter":
		prog, err := Program(Options{})
		if err == nil {
			err = Install(prog)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "installing the filter:", err)
			return 2
		}
	}
	switch mode {
	case "i386":
		// execve is a 64-bit syscall; the 32-bit program's first syscall
		// (int 0x80) must kill it.
		err := syscall.Exec(os.Getenv("ELF32"), []string{"elf32"}, nil)
		fmt.Fprintln(os.Stderr, "exec:", err)
		return 3
	case "x32":
		_, _, e := syscall.RawSyscall(sysnr("getpid")|x32Bit, 0, 0, 0)
		fmt.Printf("x32 getpid returned errno %d\n", e)
		return 0
	case "cost", "cost-filter":
		printCosts()
		return 0
	}
	dir := os.Getenv("PROBE_DIR")
	rep := probeReport{Errnos: map[string]int{}}
	for _, p := range probes {
		rep.Errnos[p.name] = int(p.fn(dir))
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, st := range tasks {
		b, _ := os.ReadFile(st)
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "Seccomp:" {
				rep.Seccomp = append(rep.Seccomp, f[1])
			} else if len(f) == 2 && f[0] == "NoNewPrivs:" {
				rep.NoNewPrivs = append(rep.NoNewPrivs, f[1])
			}
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	return 0
}

// runProbeProcess runs the test binary as a probe in mode, in a private
// mount namespace (so the control run's mount stays its own).
func runProbeProcess(t *testing.T, mode string, env ...string) (*exec.Cmd, []byte, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), append(env, probeEnv+"="+mode, "PROBE_DIR="+t.TempDir())...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.Output()
	return cmd, out, err
}

func probeRun(t *testing.T, mode string) probeReport {
	t.Helper()
	_, out, err := runProbeProcess(t, mode)
	if err != nil {
		t.Fatalf("probe %s: %v\n%s", mode, err, out)
	}
	var rep probeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("probe %s: %v\n%s", mode, err, out)
	}
	return rep
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the probes contrast the filter with what root can do without it")
	}
}

// TestFilterInKernel installs the filter in a child and makes each probe's
// syscall; the control child, without the filter and as root, makes the
// same calls. Allowed calls must behave identically; denied ones must get
// the filter's errno with it and something else without it.
func TestFilterInKernel(t *testing.T) {
	needRoot(t)
	filtered := probeRun(t, "filter")
	control := probeRun(t, "control")
	for _, p := range probes {
		got, ctl := syscall.Errno(filtered.Errnos[p.name]), syscall.Errno(control.Errnos[p.name])
		t.Logf("%-36s filtered: %-32v unfiltered: %v", p.name, errText(got), errText(ctl))
		if p.denied == 0 {
			if got != ctl {
				t.Errorf("%s: %v with the filter, %v without: the filter changed an allowed call", p.name, errText(got), errText(ctl))
			}
			continue
		}
		if got != p.denied {
			t.Errorf("%s: %v with the filter, want %v", p.name, errText(got), p.denied)
		}
		if ctl == p.denied {
			t.Errorf("%s: %v without the filter too: the probe proves nothing", p.name, errText(ctl))
		}
	}
	for _, v := range filtered.Seccomp {
		if v != "2" {
			t.Errorf("a filtered thread has Seccomp: %s", v)
		}
	}
	for _, v := range filtered.NoNewPrivs {
		if v != "1" {
			t.Errorf("a filtered thread has NoNewPrivs: %s", v)
		}
	}
	if len(filtered.Seccomp) < 2 {
		t.Errorf("only %d threads seen", len(filtered.Seccomp))
	}
	for _, v := range control.Seccomp {
		if v != "0" {
			t.Errorf("a control thread has Seccomp: %s", v)
		}
	}
}

func errText(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return fmt.Sprintf("%s (%d)", e.Error(), int(e))
}

// elf32 is a static i386 program: exit(42) through int 0x80.
func elf32() []byte {
	const base, hdr = 0x08048000, 52 + 32
	code := []byte{0xb8, 1, 0, 0, 0, 0xbb, 42, 0, 0, 0, 0xcd, 0x80} // mov eax,1; mov ebx,42; int 0x80
	b := []byte{0x7f, 'E', 'L', 'F', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	le := binary.LittleEndian
	b = le.AppendUint16(b, 2) // ET_EXEC
	b = le.AppendUint16(b, 3) // EM_386
	b = le.AppendUint32(b, 1)
	b = le.AppendUint32(b, base+hdr) // entry
	b = le.AppendUint32(b, 52)       // phoff
	b = le.AppendUint32(b, 0)        // shoff
	b = le.AppendUint32(b, 0)        // flags
	b = le.AppendUint16(b, 52)       // ehsize
	b = le.AppendUint16(b, 32)       // phentsize
	b = le.AppendUint16(b, 1)        // phnum
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	size := uint32(hdr + len(code))
	for _, v := range []uint32{1, 0, base, base, size, size, 5, 0x1000} { // PT_LOAD, R+X
		b = le.AppendUint32(b, v)
	}
	return append(b, code...)
}

// TestI386ABIKilled runs a real 32-bit program: without the filter it
// exits 42; under it, its first int 0x80 syscall kills it with SIGSYS.
func TestI386ABIKilled(t *testing.T) {
	needRoot(t)
	path := filepath.Join(t.TempDir(), "elf32")
	if err := os.WriteFile(path, elf32(), 0o755); err != nil {
		t.Fatal(err)
	}
	err := exec.Command(path).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 42 {
		t.Skipf("a 32-bit program does not run here (no IA32 emulation?): %v", err)
	}
	_, _, err = runProbeProcess(t, "i386", "ELF32="+path)
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGSYS {
		t.Errorf("the 32-bit program under the filter ended with %v, want SIGSYS", err)
	}
}

// TestX32ABIKilled makes an x32 syscall (bit 30 set) under the filter:
// killed with SIGSYS. Without the filter it returns (ENOSYS when the
// kernel has no x32 ABI).
func TestX32ABIKilled(t *testing.T) {
	needRoot(t)
	_, out, err := runProbeProcess(t, "x32")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGSYS {
		t.Errorf("an x32 syscall under the filter: %v (%s), want SIGSYS", err, out)
	}
	_, _, e := syscall.RawSyscall(sysnr("getpid")|x32Bit, 0, 0, 0)
	t.Logf("the same x32 syscall without the filter: errno %d", e)
}

// costCalls are syscalls timed with and without the filter: one the
// kernel's verdict cache allows without running the filter, one with an
// argument check (the filter runs), and one the filter denies after
// comparing against every rule.
var costCalls = []struct {
	name string
	nr   uintptr
	arg  uintptr
}{
	{"getppid (always allowed: cached)", sysnr("getppid"), 0},
	{"personality query (argument check)", sysnr("personality"), 0xffffffff},
	{"unused syscall 400 (denied: whole filter)", 400, 0},
}

func printCosts() {
	runtime.LockOSThread()
	const n = 200000
	for _, c := range costCalls {
		t0 := time.Now()
		for range n {
			syscall.RawSyscall(c.nr, c.arg, 0, 0)
		}
		fmt.Printf("%s\t%.0f\n", c.name, float64(time.Since(t0).Nanoseconds())/n)
	}
}

// TestFilterCost times syscalls with and without the filter (logged; the
// assertion only catches a filter that makes allowed calls slow).
func TestFilterCost(t *testing.T) {
	_, with, err := runProbeProcess(t, "cost-filter")
	if err != nil {
		t.Fatal(err)
	}
	_, without, err := runProbeProcess(t, "cost")
	if err != nil {
		t.Fatal(err)
	}
	w, wo := strings.Split(strings.TrimSpace(string(with)), "\n"), strings.Split(strings.TrimSpace(string(without)), "\n")
	for i := range w {
		name, ns, _ := strings.Cut(w[i], "\t")
		_, ns0, _ := strings.Cut(wo[i], "\t")
		t.Logf("%-44s %5s ns with the filter, %5s ns without", name, ns, ns0)
	}
}
