//go:build linux

package monitor

// What the kernel program reports of each watched system call (see
// struct syscall_spec in bpf/monitor.c).
const (
	whenAlways = 1
	whenFailed = 2 // the call, only when it failed
	whenWrite  = 3 // only if its open flags write, create or truncate

	dirRaw = -2 // a name that is no path: reported as given
	dirCwd = -1 // a path relative to the cwd
	none   = -1
)

// spec is a syscall_spec: when to report the call, and which of its
// arguments are a path (and what it is relative to), a second path (the
// new name of a rename or link) and a socket address.
type spec struct {
	name        string
	when        uint8
	flags       int8
	path, dir   int8
	path2, dir2 int8
	addr        int8
}

// call reports the call and its arguments.
func call(name string) spec {
	return spec{name: name, when: whenAlways, flags: none, path: none, path2: none, addr: none}
}

// withPath adds a path at args[i], resolved against dir (dirCwd, dirRaw,
// or the index of a directory fd).
func (s spec) withPath(i, dir int8) spec { s.path, s.dir = i, dir; return s }

// withTarget adds the new name of a rename or link at args[i].
func (s spec) withTarget(i, dir int8) spec { s.path2, s.dir2 = i, dir; return s }

// onWrite reports the call only if the open flags at args[i] write.
func (s spec) onWrite(i int8) spec { s.when, s.flags = whenWrite, i; return s }

// onFailure reports the call only when it failed.
func (s spec) onFailure() spec { s.when = whenFailed; return s }

func (s spec) kernel() monitorSyscallSpec {
	return monitorSyscallSpec{When: s.when, Flags: s.flags, Path: s.path, Dir: s.dir, Path2: s.path2, Dir2: s.dir2, Addr: s.addr}
}

// watchedSyscalls are the x86_64 system calls the monitor reports, by
// number.
var watchedSyscalls = map[uint32]spec{
	59:  call("execve").withPath(0, dirCwd),
	322: call("execveat").withPath(1, 0),
	41:  call("socket"),
	42:  {name: "connect", when: whenAlways, flags: none, path: none, path2: none, addr: 1},
	101: call("ptrace"),
	165: call("mount").withPath(1, dirCwd),
	166: call("umount2").withPath(0, dirCwd),
	155: call("pivot_root").withPath(0, dirCwd),
	161: call("chroot").withPath(0, dirCwd),
	175: call("init_module"),
	313: call("finit_module"),
	176: call("delete_module").withPath(0, dirRaw),
	321: call("bpf"),
	298: call("perf_event_open"),
	246: call("kexec_load"),
	169: call("reboot"),
	105: call("setuid"),
	106: call("setgid"),
	117: call("setresuid"),
	119: call("setresgid"),
	126: call("capset"),
	272: call("unshare"),
	308: call("setns"),
	62:  call("kill"),
	200: call("tkill"),
	234: call("tgkill"),
	310: call("process_vm_readv"),
	311: call("process_vm_writev"),
	// Writes: opens for writing, creates, truncates, deletes, renames and
	// links, each path made absolute (a relative one against the cwd or
	// the directory fd); a rename's or link's new name is its Target.
	257: call("openat").withPath(1, 0).onWrite(2),
	2:   call("open").withPath(0, dirCwd).onWrite(1),
	85:  call("creat").withPath(0, dirCwd),
	76:  call("truncate").withPath(0, dirCwd),
	87:  call("unlink").withPath(0, dirCwd),
	263: call("unlinkat").withPath(1, 0),
	82:  call("rename").withPath(0, dirCwd).withTarget(1, dirCwd),
	264: call("renameat").withPath(1, 0).withTarget(3, 2),
	316: call("renameat2").withPath(1, 0).withTarget(3, 2),
	86:  call("link").withPath(0, dirCwd).withTarget(1, dirCwd),
	265: call("linkat").withPath(1, 0).withTarget(3, 2),
	// A symlink's path is the link it makes (what it points to is not
	// reported).
	88:  call("symlink").withPath(1, dirCwd),
	266: call("symlinkat").withPath(2, 1),
	// Process creation, failures only (a fork bomb meeting pids.max:
	// EAGAIN). clone3 is left out: the seccomp profile answers it ENOSYS
	// for every libc to fall back to clone.
	56: call("clone").onFailure(),
	57: call("fork").onFailure(),
	58: call("vfork").onFailure(),
	// Kernel objects counted per user (inotify instances and watches,
	// POSIX message queue bytes), failures only: a sandbox using up its
	// quota (EMFILE, ENOSPC).
	253: call("inotify_init").onFailure(),
	294: call("inotify_init1").onFailure(),
	254: call("inotify_add_watch").onFailure(),
	240: call("mq_open").onFailure(),
	// The kernel surface of the catalogue (A14–A27, A52, A56, A58, A59,
	// A64): the audit rules name them.
	53:  call("socketpair"),
	323: call("userfaultfd"),
	248: call("add_key"),
	249: call("request_key"),
	250: call("keyctl"),
	227: call("clock_settime"),
	164: call("settimeofday"),
	159: call("adjtimex"),
	305: call("clock_adjtime"),
	133: call("mknod").withPath(0, dirCwd),
	259: call("mknodat").withPath(1, 0),
	303: call("name_to_handle_at").withPath(1, 0),
	304: call("open_by_handle_at"),
	135: call("personality"),
	312: call("kcmp"),
	438: call("pidfd_getfd"),
	319: call("memfd_create").withPath(0, dirRaw),
	141: call("setpriority"),
	144: call("sched_setscheduler"),
	314: call("sched_setattr"),
	160: call("setrlimit"),
	302: call("prlimit64"),
	172: call("iopl"),
	173: call("ioperm"),
	167: call("swapon").withPath(0, dirCwd),
	168: call("swapoff").withPath(0, dirCwd),
	163: call("acct").withPath(0, dirCwd),
	179: call("quotactl"),
	320: call("kexec_file_load"),
	90:  call("chmod").withPath(0, dirCwd),
	91:  call("fchmod"),
	268: call("fchmodat").withPath(1, 0),
	452: call("fchmodat2").withPath(1, 0),
	188: call("setxattr").withPath(0, dirCwd),
	189: call("lsetxattr").withPath(0, dirCwd),
	190: call("fsetxattr"),
	285: call("fallocate"),
	428: call("open_tree").withPath(1, 0),
	429: call("move_mount"),
	430: call("fsopen").withPath(0, dirRaw),
	432: call("fsmount"),
}

// SyscallNames returns the names of the system calls the monitor
// reports (for checks that audit rules name only those).
func SyscallNames() []string {
	out := make([]string, 0, len(watchedSyscalls))
	for _, s := range watchedSyscalls {
		out = append(out, s.name)
	}
	return out
}
