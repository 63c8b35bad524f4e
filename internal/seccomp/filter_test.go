//go:build linux

package seccomp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	libseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	moby "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
)

// These tests run the filter in golang.org/x/net/bpf's VM on synthetic
// struct seccomp_data. The VM loads words big-endian, so data() stores
// each 32-bit field big-endian at the offset where the kernel's
// little-endian layout has it: the filter sees the same values.

const (
	auditArchX86_64 = 0xc000003e
	auditArchI386   = 0x40000003
	auditArchARM    = 0x40000028

	allow  = retAllow
	eperm  = retErrno | errnoEPERM
	enosys = retErrno | errnoENOSYS
	kill   = retKillProcess
)

func data(nr, auditArch uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], auditArch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[offArgs+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[offArgs+8*i+4:], uint32(a>>32))
	}
	return b
}

// filter is a compiled filter under test.
type filter struct {
	t  *testing.T
	vm *bpf.VM
}

func newFilter(t *testing.T, opt Options) filter {
	t.Helper()
	goarch, caps, err := normalize(opt)
	if err != nil {
		t.Fatal(err)
	}
	insns, err := instructions(goarch, caps)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	return filter{t, vm}
}

func nr(t *testing.T, name string) uint32 {
	t.Helper()
	n, ok := arch.X86_64.SyscallNames[name]
	if !ok {
		t.Fatalf("no syscall %s on x86_64", name)
	}
	return uint32(n)
}

// verdict runs the x86_64 syscall name with args.
func (f filter) verdict(name string, args ...uint64) uint32 {
	f.t.Helper()
	return f.run(nr(f.t, name), auditArchX86_64, args...)
}

func (f filter) run(n, auditArch uint32, args ...uint64) uint32 {
	f.t.Helper()
	v, err := f.vm.Run(data(n, auditArch, args...))
	if err != nil {
		f.t.Fatal(err)
	}
	return uint32(v)
}

type call struct {
	name string
	args []uint64
	want uint32
}

func (f filter) check(calls []call) {
	f.t.Helper()
	for _, c := range calls {
		if got := f.verdict(c.name, c.args...); got != c.want {
			f.t.Errorf("%s(%#x) = %#x, want %#x", c.name, c.args, got, c.want)
		}
	}
}

func TestForeignABIsKilled(t *testing.T) {
	f := newFilter(t, Options{Arch: "amd64"})
	for _, n := range []uint32{1, 4, 11, 252} { // i386 exit, write, execve, exit_group
		if got := f.run(n, auditArchI386); got != kill {
			t.Errorf("i386 syscall %d = %#x, want KILL_PROCESS", n, got)
		}
	}
	if got := f.run(0, auditArchARM); got != kill {
		t.Errorf("arm syscall = %#x", got)
	}
	for _, name := range []string{"write", "getpid", "execve"} {
		if got := f.run(nr(t, name)|x32Bit, auditArchX86_64); got != kill {
			t.Errorf("x32 %s = %#x, want KILL_PROCESS", name, got)
		}
	}
	// The native call with the same number is fine, and -1 (a syscall a
	// tracer skipped) is allowed.
	if got := f.run(nr(t, "write"), auditArchX86_64); got != allow {
		t.Errorf("x86_64 write = %#x", got)
	}
	if got := f.run(0xffffffff, auditArchX86_64); got != allow {
		t.Errorf("nr -1 = %#x", got)
	}
}

func TestAllowedAndDenied(t *testing.T) {
	f := newFilter(t, Options{})
	var calls []call
	for _, name := range []string{"read", "write", "openat", "close", "mmap", "mprotect", "munmap", "brk",
		"futex", "execve", "exit_group", "wait4", "rt_sigaction", "epoll_pwait", "getrandom", "rseq",
		"ptrace", "process_vm_readv", "arch_prctl", "seccomp", "prctl", "pidfd_open", "memfd_create"} {
		calls = append(calls, call{name: name, want: allow})
	}
	for name := range stricter {
		if _, ok := arch.X86_64.SyscallNames[name]; ok {
			calls = append(calls, call{name: name, want: eperm})
		}
	}
	for _, name := range []string{"setns", "chroot", "reboot", "acct", "swapon", "kcmp", "vhangup", "quotactl",
		"lookup_dcookie", "nfsservctl", "sethostname", "unshare"} {
		calls = append(calls, call{name: name, want: eperm}) // Docker without capabilities
	}
	f.check(calls)
}

func TestStricterWhateverTheCaps(t *testing.T) {
	all := []string{"CAP_SYS_ADMIN", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_MODULE", "CAP_SYS_BOOT", "CAP_DAC_READ_SEARCH",
		"CAP_SYSLOG", "CAP_SYS_RAWIO", "CAP_SYS_TIME", "CAP_SYS_PTRACE", "CAP_SYS_CHROOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "sys_pacct"}
	f := newFilter(t, Options{Caps: all})
	var calls []call
	for name := range stricter {
		if _, ok := arch.X86_64.SyscallNames[name]; ok {
			calls = append(calls, call{name: name, want: eperm})
		}
	}
	// What the capabilities do allow, as in Docker.
	for _, name := range []string{"setns", "chroot", "reboot", "acct", "kcmp", "sethostname", "fanotify_init", "mbind"} {
		calls = append(calls, call{name: name, want: allow})
	}
	const newUser, newNS, newNet, sigchld = cloneNewUser, 0x20000, 0x40000000, 17
	calls = append(calls,
		call{"clone", []uint64{newNS | sigchld}, allow},
		call{"clone", []uint64{newUser | sigchld}, eperm},
		call{"clone", []uint64{newUser | newNS | sigchld}, eperm},
		call{"unshare", []uint64{newNet}, allow},
		call{"unshare", []uint64{newUser}, eperm},
		call{"unshare", []uint64{newUser | newNet}, eperm},
		call{"clone3", nil, enosys},
		// CAP_SYS_RESOURCE would let prlimit reach another uid's
		// process; the filter refuses setting any other process's.
		call{"prlimit64", []uint64{1, 7, 0x1000, 0}, eperm},
		call{"prlimit64", []uint64{0, 7, 0x1000, 0}, allow},
	)
	f.check(calls)
}

func TestArgumentConditions(t *testing.T) {
	f := newFilter(t, Options{})
	const (
		afUnix, afInet, afInet6, afNetlink, afPacket, afALG, afVsock = 1, 2, 10, 16, 17, 38, 40
		sigchld, cloneVM, cloneThread                                = 17, 0x100, 0x10000
		newNS, newUser, newPID, newNet, newCgroup                    = 0x20000, cloneNewUser, 0x20000000, 0x40000000, 0x02000000
	)
	f.check([]call{
		{"socket", []uint64{afUnix, 1, 0}, allow},
		{"socket", []uint64{afInet, 1, 0}, allow},
		{"socket", []uint64{afInet6, 2, 0}, allow},
		{"socket", []uint64{afNetlink, 3, 0}, allow},
		{"socket", []uint64{afPacket, 3, 0}, allow},
		{"socket", []uint64{afVsock, 1, 0}, eperm},
		{"socket", []uint64{afALG, 5, 0}, eperm},
		{"socket", []uint64{46, 1, 0}, eperm},
		{"socket", []uint64{1<<32 | afInet, 1, 0}, eperm}, // high bits set: compared as 64 bits
		{"socket", []uint64{1<<32 | 1, 1, 0}, eperm},
		{"socket", []uint64{21, 5, 0}, eperm}, // AF_RDS: Docker allows it, and a modular kernel autoloads it
		{"socket", []uint64{30, 1, 0}, eperm}, // AF_TIPC
		{"socket", []uint64{44, 3, 0}, eperm}, // AF_XDP
		{"socketpair", []uint64{afUnix, 1, 0}, allow},
		{"socketpair", []uint64{30, 1, 0}, eperm},
		{"personality", []uint64{0}, allow},
		{"personality", []uint64{8}, allow},
		{"personality", []uint64{0x20000}, allow},
		{"personality", []uint64{0x20008}, allow},
		{"personality", []uint64{0xffffffff}, allow},
		{"personality", []uint64{0x0040000}, eperm}, // ADDR_NO_RANDOMIZE
		{"personality", []uint64{1<<32 | 8}, eperm},
		{"clone", []uint64{sigchld}, allow},
		{"clone", []uint64{cloneVM | cloneThread | 0xf00}, allow},
		{"clone", []uint64{1<<40 | sigchld}, allow}, // clone takes the low 32 bits of flags
		{"clone", []uint64{newUser | sigchld}, eperm},
		{"clone", []uint64{newNS}, eperm},
		{"clone", []uint64{newPID}, eperm},
		{"clone", []uint64{newNet}, eperm},
		{"clone", []uint64{newCgroup}, eperm},
		{"unshare", []uint64{0x200}, eperm},
		{"clone3", nil, enosys},
		// Limits: its own (pid 0) set and read, anyone's read, nobody
		// else's set (the agent's, PID 1, or one of its threads).
		{"prlimit64", []uint64{0, 7, 0x1000, 0x2000}, allow},
		{"prlimit64", []uint64{0, 7, 0, 0x2000}, allow},
		{"prlimit64", []uint64{1, 7, 0, 0x2000}, allow},
		{"prlimit64", []uint64{1, 7, 0x1000, 0}, eperm},
		{"prlimit64", []uint64{1, 0, 0x1000, 0x2000}, eperm},
		{"prlimit64", []uint64{42, 7, 0x1000, 0}, eperm},
		{"prlimit64", []uint64{1 << 32, 7, 0x1000, 0}, eperm}, // pid compared as 64 bits
		{"setrlimit", []uint64{7, 0x1000}, allow},
	})
}

func TestNewerSyscallsENOSYS(t *testing.T) {
	f := newFilter(t, Options{})
	maxNr := 0
	for n := range arch.X86_64.SyscallNumbers {
		maxNr = max(maxNr, n)
	}
	for _, n := range []uint32{uint32(maxNr) + 1, 468, 469, 1000, x32Bit - 1} {
		if got := f.run(n, auditArchX86_64); got != enosys {
			t.Errorf("syscall %d = %#x, want ENOSYS", n, got)
		}
	}
	// A syscall in the table's range that is not allowed gets Docker's
	// EPERM (400 is in x86_64's unused 336–423 range; the highest, 467,
	// is open_tree_attr).
	for _, n := range []uint32{nr(t, "acct"), 400, uint32(maxNr)} {
		if got := f.run(n, auditArchX86_64); got != eperm {
			t.Errorf("syscall %d = %#x, want EPERM", n, got)
		}
	}
}

// TestNotLooserThanDocker checks every x86_64 syscall with zero arguments
// against the moby profile resolved independently here for a sandbox
// without capabilities: whatever DSec allows, Docker allows.
func TestNotLooserThanDocker(t *testing.T) {
	dockerAllows := map[string]bool{}
	for _, s := range moby.DefaultProfile().Syscalls {
		if s.Action != specs.ActAllow || len(s.Args) > 0 || s.Excludes != nil {
			continue
		}
		if inc := s.Includes; inc != nil && (len(inc.Caps) > 0 || len(inc.Arches) > 0 && !slices.Contains(inc.Arches, "amd64")) {
			continue
		}
		for _, n := range s.Names {
			dockerAllows[n] = true
		}
	}
	f := newFilter(t, Options{})
	allowed := 0
	for n, name := range arch.X86_64.SyscallNumbers {
		switch name {
		case "socket", "personality", "clone": // conditional in both
			continue
		}
		if f.run(uint32(n), auditArchX86_64) == allow {
			allowed++
			if !dockerAllows[name] {
				t.Errorf("DSec allows %s, Docker does not", name)
			}
		}
	}
	t.Logf("%d x86_64 syscalls allowed unconditionally (Docker: %d names, some of other arches)", allowed, len(dockerAllows))
}

// TestLibraryAssemblerBug documents why assemble does not use
// go-seccomp-bpf's Policy.Assemble: after socket's argument check fails,
// the accumulator holds the argument, and the next group compares it
// against syscall numbers. If this test starts failing, the library is
// fixed (and could be used again).
func TestLibraryAssemblerBug(t *testing.T) {
	p := libseccomp.Policy{DefaultAction: libseccomp.ActionErrno, Syscalls: []libseccomp.SyscallGroup{
		{Action: libseccomp.ActionAllow, NamesWithCondtions: []libseccomp.NameWithConditions{{
			Name: "socket", Conditions: libseccomp.ArgumentConditions{{Argument: 0, Operation: libseccomp.Equal, Value: 2}},
		}}},
		{Action: libseccomp.ActionAllow, Names: []string{"read", "sendfile"}},
	}}
	insns, err := p.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := vm.Run(data(nr(t, "socket"), auditArchX86_64, 40, 1, 0))
	if uint32(v) != allow {
		t.Errorf("go-seccomp-bpf no longer allows socket(AF_VSOCK) here (%#x): the bug is fixed", v)
	}
	// DSec's filter, with socket(AF_INET) and sendfile both allowed,
	// denies it.
	if got := newFilter(t, Options{}).verdict("socket", 40, 1, 0); got != eperm {
		t.Errorf("DSec: socket(AF_VSOCK) = %#x", got)
	}
}

func TestProgram(t *testing.T) {
	a, err := Program(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Program(Options{Arch: "amd64", Caps: nil})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) || &a[0] == &b[0] {
		t.Error("Program should return equal, separate copies")
	}
	if len(a)%8 != 0 || len(a)/8 > maxInsns {
		t.Fatalf("%d bytes", len(a))
	}
	t.Logf("filter without capabilities: %d instructions, %d bytes", len(a)/8, len(a))
	c, err := Program(Options{Caps: []string{"sys_admin"}})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, c) {
		t.Error("CAP_SYS_ADMIN made no difference")
	}
	// The bytes are the instructions: first "ld [4]" (BPF_LD|BPF_W|BPF_ABS).
	if op, k := binary.NativeEndian.Uint16(a[0:]), binary.NativeEndian.Uint32(a[4:]); op != 0x20 || k != offArch {
		t.Errorf("first instruction %#x k=%d", op, k)
	}
	arm, err := Program(Options{Arch: "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("arm64 filter: %d instructions", len(arm)/8)
	if _, err := Program(Options{Arch: "riscv64"}); err == nil {
		t.Error("riscv64: no error")
	}
}

func TestStricterNamesExist(t *testing.T) {
	for name := range stricter {
		_, x := arch.X86_64.SyscallNames[name]
		_, a := arch.AARCH64.SyscallNames[name]
		if !x && !a {
			t.Errorf("%s is a syscall on neither x86_64 nor arm64", name)
		}
	}
}

func BenchmarkProgram(b *testing.B) {
	b.Run("cached", func(b *testing.B) {
		for range b.N {
			if _, err := Program(Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("build", func(b *testing.B) {
		var n int
		for i := range b.N {
			insns, err := instructions("amd64", []string{fmt.Sprint("CAP_X", i)})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := bpf.Assemble(insns); err != nil {
				b.Fatal(err)
			}
			n = len(insns)
		}
		b.ReportMetric(float64(n), "insns")
	})
}

// TestEveryNumber runs every x86_64 syscall number without a condition,
// and numbers past the table, through the filter and checks each verdict
// against the rules it was built from (the binary search of allowTree).
func TestEveryNumber(t *testing.T) {
	for _, caps := range [][]string{nil, {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE"}} {
		f := newFilter(t, Options{Caps: caps})
		rs, err := rules(arch.X86_64, "amd64", caps)
		if err != nil {
			t.Fatal(err)
		}
		byNr := map[int]rule{}
		maxNr := 0
		for _, r := range rs {
			byNr[r.nr] = r
		}
		for n := range arch.X86_64.SyscallNumbers {
			maxNr = max(maxNr, n)
		}
		checked := 0
		for n := 0; n <= maxNr+64; n++ {
			r, ok := byNr[n]
			want := uint32(eperm)
			switch {
			case ok && r.allow:
				want = allow
			case ok && len(r.sets) > 0:
				continue // conditional: TestArgumentConditions
			case ok:
				want = retErrno | r.errno
			case n > maxNr:
				want = enosys
			}
			if got := f.run(uint32(n), auditArchX86_64); got != want {
				t.Errorf("caps %v: syscall %d (%s) = %#x, want %#x", caps, n, arch.X86_64.SyscallNumbers[n], got, want)
			}
			checked++
		}
		t.Logf("caps %v: %d numbers checked", caps, checked)
	}
}
