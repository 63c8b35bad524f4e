package seccomp

import (
	"fmt"
	"slices"
	"sort"

	"github.com/elastic/go-seccomp-bpf/arch"
	moby "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// Errno values the filter returns (the same on every Linux architecture
// DSec builds for).
const (
	errnoEPERM  = 1
	errnoENOSYS = 38
)

// minKernel is the oldest kernel DSec supports (cgroup.kill): moby rules
// that need at most this version are always included, newer ones never.
var minKernel = moby.KernelVersion{Kernel: 5, Major: 14}

// op is an argument comparison, as libseccomp's SCMP_CMP_*.
type op int

const (
	opEQ op = iota
	opNE
	opLT
	opLE
	opGT
	opGE
	opMaskedEQ // arg & value == value2
)

// cond compares one 64-bit syscall argument.
type cond struct {
	arg      uint
	op       op
	val, two uint64
}

// rule is what the filter does with one syscall.
type rule struct {
	nr int
	// allow: always allowed. Otherwise allowed when all conds of any set
	// hold; else (or if there are no sets) the call fails with errno.
	allow bool
	sets  [][]cond
	errno uint32
}

// stricter are syscalls DSec denies (EPERM) whatever capabilities the
// sandbox keeps, with the reason; Docker allows most of them given a
// capability (see the package doc).
var stricter = map[string]string{
	"add_key":           "the kernel keyring is not namespaced",
	"keyctl":            "the kernel keyring is not namespaced",
	"request_key":       "the kernel keyring is not namespaced",
	"bpf":               "verifier and map bugs are a frequent LPE vector (CVE-2021-3490)",
	"perf_event_open":   "kernel address and side-channel leaks, LPE history",
	"userfaultfd":       "widens race windows in kernel exploits",
	"kexec_load":        "loads a new kernel",
	"kexec_file_load":   "loads a new kernel",
	"init_module":       "loads kernel code",
	"finit_module":      "loads kernel code",
	"delete_module":     "unloads kernel code",
	"create_module":     "loads kernel code",
	"mount":             "a sandbox does not mount (CVE-2022-0492, CVE-2022-0185)",
	"umount2":           "a sandbox does not mount",
	"pivot_root":        "a sandbox does not mount",
	"move_mount":        "a sandbox does not mount",
	"open_tree":         "a sandbox does not mount",
	"open_tree_attr":    "a sandbox does not mount",
	"fsopen":            "a sandbox does not mount",
	"fsmount":           "a sandbox does not mount",
	"fsconfig":          "a sandbox does not mount",
	"fspick":            "a sandbox does not mount",
	"mount_setattr":     "a sandbox does not mount",
	"io_uring_setup":    "io_uring is a frequent LPE vector and bypasses seccomp per operation",
	"io_uring_enter":    "io_uring is a frequent LPE vector",
	"io_uring_register": "io_uring is a frequent LPE vector",
	"open_by_handle_at": "opens host inodes by handle (\"shocker\")",
	"syslog":            "the kernel log is not namespaced (KASLR leaks)",
	"iopl":              "raw I/O port access",
	"ioperm":            "raw I/O port access",
	"settimeofday":      "the clock is not namespaced",
	"clock_settime":     "the clock is not namespaced",
}

// Address families (linux/socket.h).
const (
	afUnix    = 1
	afInet    = 2
	afInet6   = 10
	afNetlink = 16
	afPacket  = 17
)

// socketFamilies are the only families socket(2) may create, whatever
// the capabilities; socketpair(2) gets AF_UNIX alone. Docker allows some
// thirty more (RDS, TIPC, CAN, Bluetooth, PF_KEY, XDP, SMC…): protocol
// code a sandbox has no use for, with a long CVE history, and on a kernel
// with modules the first socket() of a family loads its module with no
// capability needed (request_module("net-pf-N"), as CVE-2017-6074 used).
// AF_PACKET stays (ip and ping probe it); it needs CAP_NET_RAW over the
// node's network namespace, which no sandbox has.
var socketFamilies = []uint64{afUnix, afInet, afInet6, afNetlink, afPacket}

// cloneNewUser is CLONE_NEWUSER: clone and unshare never get it (the
// sandbox is in its own user namespace already; a nested one exposes
// kernel code that needs CAP_SYS_ADMIN otherwise).
const cloneNewUser = 0x10000000

// rules resolves Docker's default profile for the architecture info and
// capabilities caps, then applies DSec's stricter rules. The result is
// sorted by syscall number.
func rules(info *arch.Info, goarch string, caps []string) ([]rule, error) {
	p, err := dockerDefault()
	if err != nil {
		return nil, err
	}
	if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != errnoEPERM {
		return nil, fmt.Errorf("the moby default profile changed its default action (%s)", p.DefaultAction)
	}
	byName := map[string]*rule{}
	get := func(name string) *rule {
		r := byName[name]
		if r == nil {
			r = &rule{nr: -1, errno: errnoEPERM}
			byName[name] = r
		}
		return r
	}
	for _, s := range p.Syscalls {
		if !applies(s, goarch, caps) {
			continue
		}
		var set []cond
		for _, a := range s.Args {
			c, err := toCond(a)
			if err != nil {
				return nil, fmt.Errorf("syscalls %v: %w", s.Names, err)
			}
			set = append(set, c)
		}
		for _, name := range s.Names {
			if _, ok := info.SyscallNames[name]; !ok {
				continue // not a syscall of this architecture
			}
			r := get(name)
			switch s.Action {
			case specs.ActAllow:
				if len(set) == 0 {
					r.allow = true
				} else {
					r.sets = append(r.sets, set)
				}
			case specs.ActErrno:
				if len(set) > 0 {
					return nil, fmt.Errorf("syscall %s: an errno rule with argument conditions", name)
				}
				r.errno = errnoEPERM
				if s.ErrnoRet != nil {
					r.errno = uint32(*s.ErrnoRet)
				}
			default:
				return nil, fmt.Errorf("syscall %s: unsupported action %s", name, s.Action)
			}
		}
	}

	// DSec's rules, whatever the capabilities.
	for name := range stricter {
		if r, ok := byName[name]; ok {
			*r = rule{nr: -1, errno: errnoEPERM}
		}
	}
	for name, fams := range map[string][]uint64{"socket": socketFamilies, "socketpair": {afUnix}} {
		r, ok := byName[name]
		if !ok || (!r.allow && len(r.sets) == 0) {
			continue
		}
		r.allow, r.sets = false, nil
		for _, f := range fams {
			r.sets = append(r.sets, []cond{{arg: 0, op: opEQ, val: f}})
		}
	}
	noNewUser := cond{arg: 0, op: opMaskedEQ, val: cloneNewUser, two: 0}
	for _, name := range []string{"clone", "unshare"} {
		r, ok := byName[name]
		if !ok || (!r.allow && len(r.sets) == 0) {
			continue
		}
		if r.allow {
			r.allow, r.sets = false, [][]cond{{}}
		}
		for i := range r.sets {
			r.sets[i] = append(slices.Clone(r.sets[i]), noNewUser)
		}
	}
	// prlimit64 sets another process's limits only if it shares the
	// caller's uid: in a sandbox, the agent's (PID 1, sandbox root's uid),
	// whom RLIMIT_NOFILE 3 stopped from starting commands and RLIMIT_CPU 0
	// killed. A process may set its own limits (pid 0: setrlimit, ulimit)
	// and read anyone's (no new limit).
	if r, ok := byName["prlimit64"]; ok && (r.allow || len(r.sets) > 0) {
		r.allow, r.sets = false, [][]cond{{{arg: 0, op: opEQ, val: 0}}, {{arg: 2, op: opEQ, val: 0}}}
	}
	if _, ok := info.SyscallNames["clone3"]; ok {
		// Its flags are in memory, out of a filter's reach: ENOSYS makes
		// glibc fall back to clone, whose flags are checked.
		*get("clone3") = rule{nr: -1, errno: errnoENOSYS}
	}

	var out []rule
	for name, r := range byName {
		r.nr = info.SyscallNames[name]
		if r.allow || len(r.sets) > 0 || r.errno != errnoEPERM {
			out = append(out, *r) // EPERM-only rules are the default
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].nr < out[j].nr })
	return out, nil
}

// applies reports whether a moby rule is in the profile for goarch and
// caps (moby's own semantics: every included cap must be held, any
// excluded cap removes the rule).
func applies(s *moby.Syscall, goarch string, caps []string) bool {
	if inc := s.Includes; inc != nil {
		if len(inc.Arches) > 0 && !slices.Contains(inc.Arches, goarch) {
			return false
		}
		for _, c := range inc.Caps {
			if !slices.Contains(caps, c) {
				return false
			}
		}
		if inc.MinKernel != nil && kernelAfter(*inc.MinKernel, minKernel) {
			return false
		}
	}
	if exc := s.Excludes; exc != nil {
		if slices.Contains(exc.Arches, goarch) {
			return false
		}
		for _, c := range exc.Caps {
			if slices.Contains(caps, c) {
				return false
			}
		}
		if exc.MinKernel != nil && !kernelAfter(*exc.MinKernel, minKernel) {
			return false
		}
	}
	return true
}

func kernelAfter(a, b moby.KernelVersion) bool {
	return a.Kernel > b.Kernel || a.Kernel == b.Kernel && a.Major > b.Major
}

func toCond(a specs.LinuxSeccompArg) (cond, error) {
	c := cond{arg: a.Index, val: a.Value, two: a.ValueTwo}
	if a.Index > 5 {
		return c, fmt.Errorf("argument index %d", a.Index)
	}
	switch a.Op {
	case specs.OpEqualTo:
		c.op = opEQ
	case specs.OpNotEqual:
		c.op = opNE
	case specs.OpLessThan:
		c.op = opLT
	case specs.OpLessEqual:
		c.op = opLE
	case specs.OpGreaterThan:
		c.op = opGT
	case specs.OpGreaterEqual:
		c.op = opGE
	case specs.OpMaskedEqual:
		c.op = opMaskedEQ
	default:
		return c, fmt.Errorf("unsupported comparison %s", a.Op)
	}
	return c, nil
}
