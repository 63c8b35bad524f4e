package monitor

// What the kernel program reports of each watched system call (see
// bpf/monitor.c): the call (1), a path at args[0] (2) or args[1] (3), a
// socket address at args[1] (4), a path at args[1] when opened for
// writing (5), the call only when it failed (6).
const (
	reportCall     = 1
	reportPath0    = 2
	reportPath1    = 3
	reportSockaddr = 4
	reportOpenW    = 5
	reportFailed   = 6 // the call, only when it failed
)

// watchedSyscalls are the x86_64 system calls the monitor reports, by
// number.
var watchedSyscalls = map[uint32]struct {
	name   string
	report uint8
}{
	59:  {"execve", reportPath0},
	322: {"execveat", reportPath1},
	41:  {"socket", reportCall},
	42:  {"connect", reportSockaddr},
	101: {"ptrace", reportCall},
	165: {"mount", reportPath1},
	166: {"umount2", reportPath0},
	155: {"pivot_root", reportPath0},
	161: {"chroot", reportPath0},
	175: {"init_module", reportCall},
	313: {"finit_module", reportCall},
	176: {"delete_module", reportPath0},
	321: {"bpf", reportCall},
	298: {"perf_event_open", reportCall},
	246: {"kexec_load", reportCall},
	169: {"reboot", reportCall},
	105: {"setuid", reportCall},
	106: {"setgid", reportCall},
	117: {"setresuid", reportCall},
	119: {"setresgid", reportCall},
	126: {"capset", reportCall},
	272: {"unshare", reportCall},
	308: {"setns", reportCall},
	62:  {"kill", reportCall},
	200: {"tkill", reportCall},
	234: {"tgkill", reportCall},
	310: {"process_vm_readv", reportCall},
	311: {"process_vm_writev", reportCall},
	257: {"openat", reportOpenW},
	// Process creation, failures only (a fork bomb meeting pids.max:
	// EAGAIN). clone3 is left out: the seccomp profile answers it ENOSYS
	// for every libc to fall back to clone.
	56: {"clone", reportFailed},
	57: {"fork", reportFailed},
	58: {"vfork", reportFailed},
	// Kernel objects counted per user (inotify instances and watches,
	// POSIX message queue bytes), failures only: a sandbox using up its
	// quota (EMFILE, ENOSPC).
	253: {"inotify_init", reportFailed},
	294: {"inotify_init1", reportFailed},
	254: {"inotify_add_watch", reportFailed},
	240: {"mq_open", reportFailed},
	87:  {"unlink", reportPath0},
	263: {"unlinkat", reportPath1},
	82:  {"rename", reportPath0},
	264: {"renameat", reportPath1},
	316: {"renameat2", reportPath1},
	// The kernel surface of the catalogue (A14–A27, A52, A56, A58, A59,
	// A64): the audit rules name them.
	53:  {"socketpair", reportCall},
	323: {"userfaultfd", reportCall},
	248: {"add_key", reportCall},
	249: {"request_key", reportCall},
	250: {"keyctl", reportCall},
	227: {"clock_settime", reportCall},
	164: {"settimeofday", reportCall},
	159: {"adjtimex", reportCall},
	305: {"clock_adjtime", reportCall},
	133: {"mknod", reportPath0},
	259: {"mknodat", reportPath1},
	303: {"name_to_handle_at", reportPath1},
	304: {"open_by_handle_at", reportCall},
	135: {"personality", reportCall},
	312: {"kcmp", reportCall},
	438: {"pidfd_getfd", reportCall},
	319: {"memfd_create", reportPath0},
	141: {"setpriority", reportCall},
	144: {"sched_setscheduler", reportCall},
	314: {"sched_setattr", reportCall},
	160: {"setrlimit", reportCall},
	302: {"prlimit64", reportCall},
	172: {"iopl", reportCall},
	173: {"ioperm", reportCall},
	167: {"swapon", reportPath0},
	168: {"swapoff", reportPath0},
	163: {"acct", reportPath0},
	179: {"quotactl", reportCall},
	320: {"kexec_file_load", reportCall},
	90:  {"chmod", reportPath0},
	91:  {"fchmod", reportCall},
	268: {"fchmodat", reportPath1},
	452: {"fchmodat2", reportPath1},
	188: {"setxattr", reportPath0},
	189: {"lsetxattr", reportPath0},
	190: {"fsetxattr", reportCall},
	285: {"fallocate", reportCall},
	428: {"open_tree", reportPath1},
	429: {"move_mount", reportCall},
	430: {"fsopen", reportPath0},
	432: {"fsmount", reportCall},
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
