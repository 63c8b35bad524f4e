package monitor

import (
	"net/netip"
	"time"
)

// Event kinds.
const (
	KindExec    = "exec"    // a program was executed (Path)
	KindSyscall = "syscall" // a watched system call returned (Syscall, Ret)
	// KindOOMKill: the kernel's OOM killer chose a task of the group
	// (Pid, UID, Comm of the victim).
	KindOOMKill = "oom-kill"
	// Kinds the node reports about a sandbox besides the kernel's:
	// KindDestroyKill, a process still running when the sandbox was
	// destroyed (Pid, UID, Comm, Path); KindFileAPI, a file API call
	// refused because its path led out of the sandbox (Syscall: the
	// operation, Path); KindOutputCapped, a command's output cut at its
	// cap (Path: the program); KindCallTimeout and KindMemoryLimit, a
	// function call ended by its deadline or at its memory limit (Path:
	// the module).
	KindDestroyKill  = "destroy-kill"
	KindFileAPI      = "file-api"
	KindOutputCapped = "output-capped"
	KindCallTimeout  = "call-timeout"
	KindMemoryLimit  = "memory-limit"
	// KindPhaseKill is reported by the node, not the kernel: a process of
	// the earlier phase still running at a phase change, killed by it
	// (Pid, UID, Comm, Path: its executable).
	KindPhaseKill = "phase-kill"
	// KindSandboxEnded is reported by the node: the sandbox ended by
	// itself (sandbox.Ended: its agent died, its VM's guest panicked or
	// powered off, its VMM exited). Pid, Comm and Path name the process
	// that ended (the agent, QEMU), Ret is its wait status (-1: unknown)
	// and Detail the sandbox's failure reason.
	KindSandboxEnded = "sandbox-ended"
)

// Event is one thing a watched task did.
type Event struct {
	Time   time.Time
	Cgroup uint64 // the task's cgroup2 id
	Kind   string
	// Syscall and Nr name the call; Ret is what it returned (a negative
	// errno when it was refused; -1 for an exec the monitor killed, see
	// RestrictExec); Args are its first three arguments.
	Syscall string
	Nr      int
	Ret     int64
	Args    [3]uint64
	Pid     uint32 // the process (thread group) id, as the host sees it
	Tid     uint32
	UID     uint32 // the host uid
	Comm    string
	// Path is the program executed (as named), or the call's path
	// argument: absolute, a relative one resolved against the caller's
	// cwd or directory fd in its root (the sandbox's), "." and ".."
	// removed; a name that is no path (a memfd's, a module's) as given.
	Path string
	// Target is the new name of a rename or link, made absolute the same
	// way (Path is the old one).
	Target string
	// Argv is an exec's arguments (the first 255 bytes of them).
	Argv []string
	// Addr is connect's destination.
	Addr netip.AddrPort
	// Detail says, in words, what the node saw (events it reports
	// itself).
	Detail string
}

// Denied reports whether the call was refused by a security check:
// EPERM (seccomp, capabilities, cgroup-bpf), EACCES (permissions) or
// EROFS (a path the phase keeps read-only). Other errors (a missing file,
// a refused connection) are failures, not denials. An exec is denied
// when the monitor killed it (a phase's allowed executables).
func (e Event) Denied() bool {
	switch e.Kind {
	case KindExec:
		return e.Ret == -1 // killed: not an allowed executable
	case KindPhaseKill, KindOOMKill, KindDestroyKill, KindFileAPI, KindOutputCapped, KindCallTimeout, KindMemoryLimit:
		return true
	}
	return e.Kind == KindSyscall && (e.Ret == -1 || e.Ret == -13 || e.Ret == -30)
}

// Failed reports whether the call returned any other error, or the
// sandbox failed (KindSandboxEnded).
func (e Event) Failed() bool {
	return e.Kind == KindSandboxEnded || e.Kind == KindSyscall && e.Ret < 0 && !e.Denied()
}
