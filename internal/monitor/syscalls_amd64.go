package monitor

// What the kernel program reports of each watched system call (see
// bpf/monitor.c): the call (1), a path at args[0] (2) or args[1] (3), a
// socket address at args[1] (4), a path at args[1] when opened for
// writing (5).
const (
	reportCall     = 1
	reportPath0    = 2
	reportPath1    = 3
	reportSockaddr = 4
	reportOpenW    = 5
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
	87:  {"unlink", reportPath0},
	263: {"unlinkat", reportPath1},
	82:  {"rename", reportPath0},
	264: {"renameat", reportPath1},
	316: {"renameat2", reportPath1},
}
