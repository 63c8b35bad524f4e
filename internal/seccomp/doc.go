// Package seccomp builds the container tier's seccomp filter: Docker's
// default profile (github.com/moby/profiles/seccomp v0.3.0,
// DefaultProfile) resolved for the sandbox's capabilities and
// architecture, made stricter, and compiled in pure Go to classic BPF.
// [Program] returns the filter as bytes the runtime hands to the
// sandbox's setup code, which calls [Install] on itself just before
// execve.
//
// # Resolving Docker's profile
//
// Rules apply as in moby: a rule is included if the architecture is in
// includes.arches (when given), every capability of includes.caps is in
// Options.Caps, and includes.minKernel is at most 5.14 (DSec's minimum
// kernel); it is dropped if excludes match. Argument conditions are kept
// (socket families, personality values, clone flags). Names the
// architecture does not have (the 32-bit *_time64 calls, socketcall…) are
// skipped, as libseccomp does.
//
// # Default actions
//
//   - A syscall the filter does not allow fails with EPERM, Docker's
//     SCMP_ACT_ERRNO.
//   - A syscall number above the highest one in the syscall table
//     (go-seccomp-bpf's, up to open_tree_attr = 467 on x86_64) fails with
//     ENOSYS, as runc does for syscalls newer than its profile: libc and
//     language runtimes treat ENOSYS as "use the older call" and EPERM as
//     a hard error. Such calls are denied either way.
//   - The i386 ABI (int 0x80 on x86_64, AUDIT_ARCH_I386) and the x32 ABI
//     (syscall numbers with bit 30 set) kill the process
//     (SECCOMP_RET_KILL_PROCESS). Docker builds a multi-arch filter that
//     allows them; DSec runs 64-bit code only, and a 32-bit entry point
//     is the classic way around a filter written for the native ABI.
//     arm64 kills the 32-bit arm ABI the same way.
//   - Syscall -1 (what a tracer sets to skip a call) is allowed: no kernel
//     code runs.
//
// # Stricter than Docker
//
// Whatever Options.Caps holds, these fail with EPERM:
//
//	syscalls                                Docker default               why DSec denies them
//	mount umount2 move_mount open_tree      with CAP_SYS_ADMIN           a sandbox does not mount; mount is the
//	fsopen fsmount fsconfig fspick          with CAP_SYS_ADMIN           door to cgroup release_agent
//	mount_setattr; pivot_root               pivot_root: never            (CVE-2022-0492) and fsconfig overflows
//	open_tree_attr                          (not listed: never)          (CVE-2022-0185)
//	bpf                                     CAP_SYS_ADMIN or CAP_BPF     verifier/map bugs (CVE-2021-3490)
//	perf_event_open                         CAP_SYS_ADMIN or CAP_PERFMON address and side-channel leaks
//	init_module finit_module delete_module  CAP_SYS_MODULE               kernel code
//	kexec_load kexec_file_load              never                        pinned: a future profile cannot allow
//	add_key keyctl request_key              never                        pinned: keyrings are not namespaced
//	userfaultfd                             never                        pinned: race-window widener for exploits
//	io_uring_setup/enter/register           never                        pinned: frequent LPE vector, and its
//	                                                                     operations bypass per-syscall filtering
//	open_by_handle_at                       CAP_DAC_READ_SEARCH          "shocker": opens host inodes by handle
//	syslog                                  CAP_SYS_ADMIN or CAP_SYSLOG  kernel log is not namespaced (KASLR)
//	iopl ioperm                             CAP_SYS_RAWIO                raw I/O port access
//	settimeofday clock_settime              CAP_SYS_TIME                 the clock is not namespaced
//	clone with CLONE_NEWUSER                with CAP_SYS_ADMIN           the sandbox has its own user namespace
//	unshare with CLONE_NEWUSER              with CAP_SYS_ADMIN           already; a nested one exposes code that
//	                                                                     needs CAP_SYS_ADMIN (CVE-2022-0185)
//	clone3                                  CAP_SYS_ADMIN, else ENOSYS   always ENOSYS: its flags are in memory,
//	                                                                     out of a filter's reach; libc falls
//	                                                                     back to clone, whose flags are checked
//	i386 and x32 ABIs                       allowed                      kill (see above)
//	socket of families but AF_UNIX, AF_INET some thirty more families    protocol code sandboxes do not use; a
//	AF_INET6, AF_NETLINK, AF_PACKET                                      kernel with modules loads a family's
//	socketpair of families but AF_UNIX      any family                   module on first use, no capability
//	                                                                     needed (CVE-2017-6074's way in)
//	prlimit64 setting another process's     allowed                      the agent (PID 1) shares sandbox
//	limits (pid not 0, a new limit given)                                root's uid, so root could set its
//	                                                                     limits: RLIMIT_NOFILE 3 stopped every
//	                                                                     command, RLIMIT_CPU 0 killed it
//
// Without CAP_SYS_ADMIN, clone with any namespace flag and every unshare
// fail as in Docker.
//
// # Kept as Docker
//
//   - ptrace, process_vm_readv, process_vm_writev are allowed (Docker
//     allows them on kernels ≥ 4.8, where seccomp re-checks a syscall a
//     tracer changed, so ptrace cannot bypass the filter). Tests and
//     debuggers need them; the pid namespace limits the targets to the
//     sandbox's own processes. The runtime must not leave a process of
//     its own in that namespace that shares the sandbox's uid and is
//     dumpable (prctl(PR_SET_DUMPABLE, 0) makes it untraceable).
//   - personality: only the values Docker allows (0, PER_LINUX32,
//     UNAME26 and their mix, and the 0xffffffff query).
//
// # Why not go-seccomp-bpf's assembler
//
// go-seccomp-bpf v1.6.0's Policy.Assemble does not reload the syscall
// number after an argument check fails, so the syscalls compared after a
// conditional one are compared against an argument: with socket allowed
// for AF_INET only and sendfile (40) allowed, socket(AF_VSOCK = 40) is
// allowed (TestLibraryAssemblerBug). This package uses the library's
// syscall tables only and emits its own code, in which every
// argument-checking block ends in a return.
package seccomp
