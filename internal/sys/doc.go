// Package sys is DSec's one gateway to the kernel: every system call
// DSec makes itself (rather than through os, net or os/exec) goes
// through a function here, so the calls DSec makes into the kernel can
// be read, reviewed and stubbed for other systems in one place. Off Linux the functions return errors wrapping
// errdefs.ErrNotSupported (or do nothing where nothing can be left
// behind).
//
// The rule, kept by TestGateway: no non-test Go file of the module
// outside this package calls a function of package syscall or imports
// golang.org/x/sys/unix. The types, constants and variables of package
// syscall stay usable everywhere (syscall.Signal, syscall.SIGTERM,
// syscall.WaitStatus, syscall.SysProcAttr, syscall.Errno values,
// syscall.MS_BIND…): they are the vocabulary the standard library
// itself speaks (os.Process.Signal, exec.Cmd.SysProcAttr, errors.Is
// against an errno), and naming a value enters no kernel. The functions
// are where the kernel is entered, or where its binary layouts are built
// (socket control messages), so those are what the gateway holds. The
// rule covers the files built for Linux or macOS; tests (which probe the
// kernel's state on purpose), testdata programs (run inside sandboxes as
// probes) and files for other systems (tools/wasm's, for wasip1, whose
// package syscall is the WASI host's, not a kernel's) are outside it.
//
// The files are named for the kernel subsystem they reach, never for a
// caller: X_linux.go makes the calls, X_other.go stubs what code built
// for other systems calls (clock and system have no such callers), and
// X.go holds what is the same everywhere (types, and calls package
// syscall makes alike on Linux and macOS):
//
//	mount        mount(2) and umount(2): tmpfs, erofs, overlay, FUSE, binds,
//	             pivot_root and switch-root
//	mountfd      mounts as descriptors (open_tree, move_mount,
//	             mount_setattr): detached and id-mapped mounts, a root's
//	             read-only state and writable binds
//	mountinfo    reading /proc/self/mountinfo
//	statfs       file systems' types and usage
//	fsfreeze     syncing, freezing and thawing a file system
//	file         files and descriptors: small writes, clones, renames,
//	             device nodes, flock, close-on-exec
//	xattr        extended attributes
//	ns           mount, UTS and user namespaces; running a tool contained
//	netns        network namespaces
//	socket       sockets: peer credentials, descriptor passing, buffers,
//	             link flags
//	proc         processes: signals, waits, fork/exec, rlimits, subreaper
//	pidfd        pidfds: killing and watching one process for its life
//	cred         credentials and privileges: a thread's uid, capabilities,
//	             securebits, no_new_privs, dumpable
//	seccomp      seccomp filters
//	cgroup       cgroup2 ids and event files
//	mem          memory: reserved mappings, dropped pages, the page cache
//	sched        CPU affinity of threads
//	clock        clocks
//	tty          pseudo-terminals
//	system       the machine: power off, kernel modules
//
// unsafe appears only in *_unsafe.go files.
package sys
