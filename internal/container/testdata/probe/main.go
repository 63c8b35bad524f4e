// Command probe is the attacker of the container tier's isolation tests
// (internal/container/isolation_linux_test.go): each subcommand makes the
// system calls of one attack from the security catalogue and prints what
// happened as key=value lines (errno names, counts, ids), without judging
// it. The tests run it inside sandboxes, where the defences must hold,
// and as the negative control where they are absent (on the host as root,
// in a sandbox without seccomp, against a target the node can reach), so
// that every assertion is shown able to fail.
//
// It is built by the tests (CGO_ENABLED=0, static) and shipped to
// sandboxes in a layer of its own at /opt/probe/probe.
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe sys|fds|ids|read|procs|tasks|connect|listen|zombies|forks|nofile|tty|unixconn …")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "sys":
		for _, a := range args {
			// Printed as name:args=ERRNO (one = per line).
			name, arg, _ := strings.Cut(a, "=")
			fmt.Printf("%s=%s\n", strings.Replace(a, "=", ":", 1), errName(check(name, splitArgs(arg))))
		}
	case "fds":
		fds()
	case "ids":
		ids()
	case "read":
		for _, p := range args {
			read(p)
		}
	case "procs":
		procs(args)
	case "tasks":
		tasks()
	case "connect":
		connect(args)
	case "listen":
		listen(args[0])
	case "zombies":
		zombies(atoi(args[0]), len(args) > 1 && args[1] == "stay")
	case "forks":
		forks(atoi(args[0]))
	case "nofile":
		nofile()
	case "tty":
		tty()
	case "unixconn":
		unixconn(args[0])
	case "nested":
		nested(args)
	case "alloc":
		alloc(atoi(args[0]))
	case "hogs":
		hogs(atoi(args[0]), args[1])
	case "hold":
		alloc(atoi(args[0]))
		time.Sleep(time.Minute)
	case "files":
		files(args[0], atoi(args[1]))
	case "listen-unix":
		listenUnix(args[0])
	case "inotify":
		inotify(atoi(args[0]), len(args) > 1 && args[1] == "hold")
	case "mqueue":
		mqueue(atoi(args[0]), len(args) > 1 && args[1] == "hold")
	case "exec":
		// Runs args[0] with argv args[1:], and prints how that went.
		fmt.Printf("exec=%s\n", errName(execWait(args[0], args[1:], nil)))
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown subcommand %q\n", os.Args[1])
		os.Exit(2)
	}
}

func splitArgs(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func atoi(s string) int {
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe: %q is not a number\n", s)
		os.Exit(2)
	}
	return int(n)
}

// errName is "OK" for nil, else the errno's name (EPERM…).
func errName(err error) string {
	if err == nil {
		return "OK"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
		return "errno" + strconv.Itoa(int(e))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "ETIMEDOUT"
	}
	return "error:" + strings.ReplaceAll(err.Error(), " ", "_")
}

func errnoOf(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// check makes one attack's system call. Calls that could do harm if they
// succeeded get bad pointers or descriptors (bubblewrap's try-syscall
// style): allowed, they fail with EFAULT or EBADF; blocked, with EPERM or
// ENOSYS.
func check(name string, a []string) error {
	arg := func(i int) string {
		if i >= len(a) {
			fmt.Fprintf(os.Stderr, "probe: %s needs %d arguments\n", name, i+1)
			os.Exit(2)
		}
		return a[i]
	}
	switch name {
	// Mounts (A4, A5, A6, A9).
	case "mount-tmpfs":
		_ = os.MkdirAll(arg(0), 0o755)
		return unix.Mount("dsec-probe", arg(0), "tmpfs", 0, "size=1m")
	case "mount-bind":
		_ = os.MkdirAll(arg(1), 0o755)
		return unix.Mount(arg(0), arg(1), "", unix.MS_BIND|unix.MS_REC, "")
	case "mount-proc":
		_ = os.MkdirAll(arg(0), 0o755)
		return unix.Mount("proc", arg(0), "proc", 0, "")
	case "mount-cgroup":
		// A v1 hierarchy (rdma unless named), whose root has release_agent.
		_ = os.MkdirAll(arg(0), 0o755)
		opts := "rdma"
		if len(a) > 1 {
			opts = a[1]
		}
		return unix.Mount("cgroup", arg(0), "cgroup", 0, opts)
	case "umount":
		return unix.Unmount(arg(0), unix.MNT_DETACH)
	case "chroot":
		// The double escape: chroot into a subdirectory, walk up past it,
		// chroot to where that leads.
		_ = os.MkdirAll(arg(0), 0o755)
		if err := unix.Chroot(arg(0)); err != nil {
			return err
		}
		for range 16 {
			_ = unix.Chdir("..")
		}
		return unix.Chroot(".")
	case "pivot-root":
		// pivot_root . old, with the directory made a mount point first.
		_ = os.MkdirAll(filepath.Join(arg(0), "old"), 0o755)
		_ = unix.Mount(arg(0), arg(0), "", unix.MS_BIND, "")
		if err := unix.Chdir(arg(0)); err != nil {
			return err
		}
		return unix.PivotRoot(".", "old")

	// Namespaces (A7, A8).
	case "unshare-net":
		runtime.LockOSThread() // the thread is left in the namespace and dies with the process
		return unix.Unshare(unix.CLONE_NEWNET)
	case "unshare-mnt":
		runtime.LockOSThread()
		return unix.Unshare(unix.CLONE_NEWNS)
	case "clone-newuser":
		// clone(CLONE_NEWUSER) the way Go's os/exec makes it, running arg 0.
		pid, err := syscall.ForkExec(arg(0), []string{arg(0)}, &syscall.ProcAttr{
			Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER},
		})
		if err == nil {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, 0, nil)
		}
		return err
	case "setns":
		runtime.LockOSThread()
		fd, err := unix.Open(arg(0), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Setns(fd, 0)

	// Devices and handles (A14, A15).
	case "mknod-blk", "mknod-chr":
		mode, dev := uint32(unix.S_IFBLK|0o600), unix.Mkdev(8, 0)
		if name == "mknod-chr" {
			mode, dev = unix.S_IFCHR|0o600, unix.Mkdev(1, 1) // /dev/mem
		}
		err := unix.Mknod(arg(0), mode, int(dev))
		if err == nil {
			_ = os.Remove(arg(0))
		}
		return err
	case "open-by-handle":
		return openByHandle(arg(0))

	// Kernel attack surface (A19–A27).
	case "finit-module":
		return errnoOf(rawSyscall(unix.SYS_FINIT_MODULE, ^uintptr(0), strPtr(""), 0))
	case "init-module":
		return errnoOf(rawSyscall(unix.SYS_INIT_MODULE, 0, 0, strPtr("")))
	case "delete-module":
		return errnoOf(rawSyscall(unix.SYS_DELETE_MODULE, strPtr("dsec_probe_no_such_module"), unix.O_NONBLOCK, 0))
	case "socket":
		fd, err := unix.Socket(atoi(arg(0)), atoi(arg(1))|unix.SOCK_CLOEXEC, atoi(arg(2)))
		if err == nil {
			unix.Close(fd)
		}
		return err
	case "socketpair":
		fds, err := unix.Socketpair(atoi(arg(0)), atoi(arg(1))|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
		}
		return err
	case "bpf-prog-load":
		return errnoOf(rawSyscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0))
	case "bpf-map-create":
		return errnoOf(rawSyscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, 0, 0))
	case "perf-event-open":
		return errnoOf(rawSyscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0))
	case "ptrace-attach":
		return ptraceAttach(target(arg(0)))
	case "process-vm-readv":
		// A bad remote address: allowed, it fails with EFAULT.
		buf := make([]byte, 8)
		_, err := unix.ProcessVMReadv(target(arg(0)), []unix.Iovec{{Base: &buf[0], Len: 8}}, []unix.RemoteIovec{{Base: 8, Len: 8}}, 0)
		return err
	case "pidfd-getfd":
		pfd, err := unix.PidfdOpen(target(arg(0)), 0)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		fd, err := unix.PidfdGetfd(pfd, 0, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	case "kcmp":
		return errnoOf(rawSyscall6(unix.SYS_KCMP, uintptr(target(arg(0))), uintptr(os.Getpid()), 1 /* KCMP_VM */, 0, 0, 0))
	case "userfaultfd":
		fd, _, e := unix.RawSyscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return errnoOf(e)
	case "keyctl":
		sessionKeyring := int32(-3) // KEY_SPEC_SESSION_KEYRING
		return errnoOf(rawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(uint32(sessionKeyring)), 0))
	case "add-key":
		processKeyring := int32(-2) // KEY_SPEC_PROCESS_KEYRING; an empty payload: EINVAL if allowed
		return errnoOf(rawSyscall6(unix.SYS_ADD_KEY, strPtr("user"), strPtr("dsec-probe"), 0, 0, uintptr(uint32(processKeyring)), 0))
	case "request-key":
		return errnoOf(rawSyscall(unix.SYS_REQUEST_KEY, strPtr("user"), strPtr("dsec-probe-no-such-key"), 0))
	case "clock-settime":
		return errnoOf(rawSyscall(unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME, 1, 0))
	case "settimeofday":
		return errnoOf(rawSyscall(unix.SYS_SETTIMEOFDAY, 1, 0, 0))
	case "adjtime-tick":
		// clock_adjtime is allowed for reading; setting the tick to the
		// value it has (a change that changes nothing) needs CAP_SYS_TIME.
		var tx unix.Timex
		if _, err := unix.ClockAdjtime(unix.CLOCK_REALTIME, &tx); err != nil {
			return err
		}
		tx = unix.Timex{Modes: unix.ADJ_TICK, Tick: tx.Tick}
		_, err := unix.ClockAdjtime(unix.CLOCK_REALTIME, &tx)
		return err
	case "clone3":
		return errnoOf(rawSyscall(unix.SYS_CLONE3, 0, 88, 0))
	case "personality":
		old, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, uintptr(atoi(arg(0))), 0, 0)
		if e == 0 && uint32(atoi(arg(0))) != 0xffffffff {
			unix.RawSyscall(unix.SYS_PERSONALITY, old, 0, 0)
		}
		return errnoOf(e)
	case "open-tty":
		fd, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	case "tiocsti":
		return tiocsti(0, false)
	case "tiocsti-high":
		return tiocsti(0, true)

	// Files (A10–A13, A59, A63).
	case "openw":
		fd, err := unix.Open(arg(0), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	case "write":
		fd, err := unix.Open(arg(0), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		_, err = unix.Write(fd, []byte(arg(1)))
		return err
	case "mkdir":
		return unix.Mkdir(arg(0), 0o755)
	case "setxattr-cap":
		// security.capability v2: cap_setuid in permitted and effective.
		_ = os.WriteFile(arg(0), []byte("x"), 0o755)
		v := []byte{0x01, 0x00, 0x00, 0x02, 1 << 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		return unix.Setxattr(arg(0), "security.capability", v, 0)

	// Scheduling (A56): a real-time policy or a raised priority, each
	// given back at once if it was granted.
	case "sched-fifo":
		err := errnoOf(schedSetscheduler(unix.SCHED_FIFO, 1))
		if err == nil {
			schedSetscheduler(0, 0) // SCHED_OTHER
		}
		return err
	case "sched-attr-rr":
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_RR, Priority: 1}
		err := unix.SchedSetAttr(0, &attr, 0)
		if err == nil {
			_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr}, 0)
		}
		return err
	case "nice":
		old, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
		if err != nil {
			return err
		}
		err = unix.Setpriority(unix.PRIO_PROCESS, 0, atoi(arg(0)))
		if err == nil {
			_ = unix.Setpriority(unix.PRIO_PROCESS, 0, 20-old)
		}
		return err

	// The runtime's binaries (A1): a process's executable opened by
	// path (O_PATH), then reopened for writing through the descriptor
	// once the process is gone (CVE-2019-5736). "copy" runs a copy of
	// this program for the purpose (writing it changes nothing else).
	case "exe-reopen":
		return exeReopen(arg(0))

	// Fileless execution (A64): a memfd holding a program, run through
	// its descriptor; a program copied to dir and run from there.
	case "memfd-exec":
		return memfdExec(arg(0))
	case "copy-exec":
		dst := filepath.Join(arg(1), "dsec-probe-payload")
		b, err := os.ReadFile(arg(0))
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			return err
		}
		defer os.Remove(dst)
		return execWait(dst, []string{"true"}, nil)

	// Disk (A50): an allocation of arg 1 bytes.
	case "fallocate":
		fd, err := unix.Open(arg(0), unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Fallocate(fd, 0, 0, int64(atoi(arg(1))))

	// Privilege back (A60): setuid(2) of this thread alone.
	case "setuid":
		return errnoOf(rawSyscall(unix.SYS_SETUID, uintptr(atoi(arg(0))), 0, 0))

	// Limits (A52).
	case "raise-nofile":
		var l unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil {
			return err
		}
		n := l.Max + 1
		if len(a) > 0 {
			n = uint64(atoi(a[0]))
		}
		return unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n})
	// Another process's limits (the agent's, PID 1): prlimit=PID,RESOURCE,N
	// sets soft and hard limit to N (RESOURCE: nofile, cpu, nproc, as).
	case "prlimit":
		res := map[string]int{"nofile": unix.RLIMIT_NOFILE, "cpu": unix.RLIMIT_CPU, "nproc": unix.RLIMIT_NPROC, "as": unix.RLIMIT_AS}[arg(1)]
		n := uint64(atoi(arg(2)))
		return unix.Prlimit(target(arg(0)), res, &unix.Rlimit{Cur: n, Max: n}, nil)
	// Reading another process's limits only (no new limit).
	case "prlimit-get":
		var old unix.Rlimit
		return unix.Prlimit(target(arg(0)), unix.RLIMIT_NOFILE, nil, &old)
	}
	fmt.Fprintf(os.Stderr, "probe: unknown check %q\n", name)
	os.Exit(2)
	return nil
}

// target is a pid argument: a number, or "child" for a child started
// for the purpose (a process this one may trace).
func target(s string) int {
	if s != "child" {
		return atoi(s)
	}
	childOnce.Do(func() {
		pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "30"}, &syscall.ProcAttr{})
		if err != nil {
			fmt.Fprintf(os.Stderr, "probe: starting a child: %v\n", err)
			os.Exit(2)
		}
		childPid = pid
	})
	return childPid
}

var (
	childOnce sync.Once
	childPid  int
)

func ptraceAttach(pid int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceAttach(pid); err != nil {
		return err
	}
	var ws unix.WaitStatus
	_, _ = unix.Wait4(pid, &ws, unix.WALL, nil)
	return unix.PtraceDetach(pid)
}

// openByHandle is "shocker": open a file by a handle of the file system
// of dir, the handle the kernel gives for dir if it gives one, else one
// forged for inode 2 (the root of ext2/3/4).
func openByHandle(dir string) error {
	mfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, dir, 0)
	if err != nil {
		h = unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0}) // FILEID_INO32_GEN {ino 2, gen 0}
	}
	fd, err := unix.OpenByHandleAt(mfd, h, unix.O_RDONLY|unix.O_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// fds lists the descriptors this process inherited (those without
// close-on-exec: the Go runtime opens its own with it) and where they
// lead.
func fds() {
	dfd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Printf("error=%s\n", errName(err))
		return
	}
	defer unix.Close(dfd)
	buf := make([]byte, 64<<10)
	var names []string
	for {
		n, err := unix.ReadDirent(dfd, buf)
		if err != nil || n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	var nums []int
	for _, s := range names {
		n, err := strconv.Atoi(s)
		if err != nil || n == dfd {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue
		}
		nums = append(nums, n)
	}
	slices.Sort(nums)
	for _, n := range nums {
		target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(n))
		if err != nil {
			target = errName(err)
		}
		fmt.Printf("fd%d=%s\n", n, target)
	}
	fmt.Printf("count=%d\n", len(nums))
}

// ids prints who this process is.
func ids() {
	fmt.Printf("uid=%d\neuid=%d\ngid=%d\negid=%d\n", unix.Getuid(), unix.Geteuid(), unix.Getgid(), unix.Getegid())
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		switch k {
		case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp":
			if ok {
				fmt.Printf("%s=%s\n", k, strings.TrimSpace(v))
			}
		}
	}
}

// read describes a path: type, device numbers of device nodes, the size
// of a file capability xattr, bytes readable (up to 64 MiB) or directory
// entries.
func read(p string) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		fmt.Printf("%s=%s\n", p, errName(err))
		return
	}
	kind := "other"
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		kind = "reg"
	case unix.S_IFDIR:
		kind = "dir"
	case unix.S_IFCHR:
		kind = fmt.Sprintf("chr:%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		kind = fmt.Sprintf("blk:%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	if n, err := unix.Getxattr(p, "security.capability", nil); err == nil && n > 0 {
		kind += " fcaps=" + strconv.Itoa(n)
	}
	if kind == "dir" {
		ents, err := os.ReadDir(p)
		fmt.Printf("%s=dir entries=%d err=%s\n", p, len(ents), errName(err))
		return
	}
	f, err := os.Open(p)
	if err != nil {
		fmt.Printf("%s=%s bytes=0 err=%s\n", p, kind, errName(err))
		return
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	total := 0
	for total < 64<<20 {
		n, err := f.Read(buf)
		total += n
		if err != nil {
			break
		}
	}
	fmt.Printf("%s=%s bytes=%d err=OK\n", p, kind, total)
}

// procs counts the other processes this one can see, the zombies among
// them, and whether any command line contains a marker.
func procs(markers []string) {
	ents, _ := os.ReadDir("/proc")
	n, zombies := 0, 0
	seen := map[string]bool{}
	self := strconv.Itoa(os.Getpid()) // whose command line has the markers
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		n++
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				zombies++
			}
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		for _, m := range markers {
			if strings.Contains(string(cmd), m) {
				seen[m] = true
			}
		}
	}
	fmt.Printf("procs=%d\nzombies=%d\n", n, zombies)
	for _, m := range markers {
		fmt.Printf("marker.%s=%v\n", m, seen[m])
	}
}

// tasks prints, for every thread of every visible process, its seccomp
// mode, no_new_privs and effective capabilities.
func tasks() {
	// More threads of our own, parked in syscalls.
	for range 4 {
		go func() {
			runtime.LockOSThread()
			time.Sleep(time.Minute)
		}()
	}
	time.Sleep(50 * time.Millisecond)
	dirs, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/status")
		if err != nil {
			continue // exited
		}
		f := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				f[k] = strings.TrimSpace(v)
			}
		}
		parts := strings.Split(d, "/")
		fmt.Printf("task pid=%s tid=%s name=%s seccomp=%s nnp=%s capeff=%s\n", parts[2], parts[4], f["Name"], f["Seccomp"], f["NoNewPrivs"], f["CapEff"])
	}
}

// connect tries TCP connections to host:port targets at once, each for at
// most a second.
func connect(targets []string) {
	res := make([]string, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", t, time.Second)
			if err == nil {
				c.Close()
			}
			res[i] = errName(err)
		}()
	}
	wg.Wait()
	for i, t := range targets {
		fmt.Printf("%s=%s\n", t, res[i])
	}
}

// listen serves addr: every connection gets "hello" and is closed.
func listen(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Printf("listen=%s\n", errName(err))
		os.Exit(1)
	}
	fmt.Println("listen=OK")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		fmt.Printf("accepted=%s\n", c.RemoteAddr())
		c.Write([]byte("hello\n"))
		c.Close()
	}
}

// zombies forks n children that exit at once and never waits for them.
// With stay it counts its zombie children a moment later (what nobody
// reaps); either way it then exits, leaving them to whoever adopts them.
func zombies(n int, stay bool) {
	started := 0
	for range n {
		if _, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{}); err != nil {
			fmt.Printf("fork=%s\n", errName(err))
			break
		}
		started++
	}
	fmt.Printf("started=%d\n", started)
	if !stay {
		return
	}
	time.Sleep(time.Second)
	me := strconv.Itoa(os.Getpid())
	z := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(st), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == me {
			z++
		}
	}
	fmt.Printf("own_zombies=%d\n", z)
}

// forks starts n `sleep 60` children and exits without them.
func forks(n int) {
	started := 0
	var last error
	for range n {
		if _, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "60"}, &syscall.ProcAttr{}); err != nil {
			last = err
			continue
		}
		started++
	}
	fmt.Printf("started=%d\nerr=%s\n", started, errName(last))
}

// nofile prints the descriptor limits, tries to raise the hard one, and
// opens descriptors until it cannot.
func nofile() {
	var l unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &l)
	fmt.Printf("soft=%d\nhard=%d\n", l.Cur, l.Max)
	fmt.Printf("raise_hard=%s\n", errName(unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: l.Max + 1, Max: l.Max + 1})))
	fmt.Printf("soft_to_hard=%s\n", errName(unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: l.Max, Max: l.Max})))
	opened := 0
	var err error
	for {
		var fd int
		fd, err = unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		opened++
		_ = fd
	}
	fmt.Printf("opened=%d\nopen_err=%s\n", opened, errName(err))
}

// tty reports whether this process has a controlling terminal and can
// push input into it.
func tty() {
	for _, c := range []string{"open-tty", "tiocsti", "tiocsti-high"} {
		fmt.Printf("%s=%s\n", c, errName(check(c, nil)))
	}
}

// unixconn connects to a unix socket and reports whether the server kept
// the connection (open) or closed it at once (closed).
func unixconn(path string) {
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Printf("conn=%s\n", errName(err))
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		fmt.Println("conn=open")
	case err != nil:
		fmt.Println("conn=closed")
	default:
		fmt.Println("conn=open")
	}
}

// nested re-runs the probe with args in a new user and mount namespace,
// holding CAP_SYS_ADMIN there (an ambient capability, so that it survives
// exec as the namespace's unmapped uid): the kernel code only a nested
// user namespace exposes (CVE-2022-0185 and the like).
func nested(args []string) {
	self, err := os.Executable()
	if err != nil {
		fmt.Printf("clone=%s\n", errName(err))
		return
	}
	var out strings.Builder
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN},
	}
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil // the child ran
	}
	fmt.Printf("clone=%s\n", errName(err))
	fmt.Print(out.String())
}

// alloc allocates mib MiB and touches every page of it.
func alloc(mib int) {
	b := make([]byte, mib<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	fmt.Printf("allocated=%d\n", mib)
}

// hogs fills memory with many small processes: n copies of this probe,
// each holding mib MiB, started together; it prints how many were
// killed (by the OOM killer) within 3 s, and how many lived on.
func hogs(n int, mib string) {
	var stopping atomic.Bool
	var killed atomic.Int32
	var wg sync.WaitGroup
	var cmds []*exec.Cmd
	for range n {
		c := exec.Command("/proc/self/exe", "hold", mib)
		if err := c.Start(); err != nil {
			break
		}
		cmds = append(cmds, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.Wait()
			if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && !stopping.Load() {
				killed.Add(1)
			}
		}()
	}
	time.Sleep(3 * time.Second)
	stopping.Store(true)
	for _, c := range cmds {
		_ = c.Process.Kill()
	}
	wg.Wait()
	fmt.Printf("started=%d\nkilled=%d\nlived=%d\n", len(cmds), killed.Load(), int32(len(cmds))-killed.Load())
}

// files creates up to n empty files in dir, until one fails.
func files(dir string, n int) {
	_ = os.MkdirAll(dir, 0o755)
	created := 0
	var err error
	for ; created < n; created++ {
		var fd int
		fd, err = unix.Open(filepath.Join(dir, strconv.Itoa(created)), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			break
		}
		unix.Close(fd)
	}
	fmt.Printf("created=%d\nerr=%s\n", created, errName(err))
	if err != nil {
		// Once more a second later, when the monitor has drained the
		// flood's events: this failure is seen.
		time.Sleep(time.Second)
		fd, err := unix.Open(filepath.Join(dir, "one-more"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		fmt.Printf("again=%s\n", errName(err))
	}
	_ = os.RemoveAll(dir)
}

// execWait runs prog with argv (argv[0] included), passing files as
// descriptors 3…, and waits for it; a non-zero exit is an error.
func execWait(prog string, argv []string, files []uintptr) error {
	fds := append([]uintptr{0, 1, 2}, files...)
	pid, err := syscall.ForkExec(prog, argv, &syscall.ProcAttr{Files: fds, Env: []string{"PATH=/bin:/usr/bin"}})
	if err != nil {
		return err
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	if ws.ExitStatus() != 0 {
		return fmt.Errorf("exit status %d", ws.ExitStatus())
	}
	return nil
}

// memfdExec copies prog into a memfd and runs it (as "true", the busybox
// applet) through /dev/fd/3.
func memfdExec(prog string) error {
	b, err := os.ReadFile(prog)
	if err != nil {
		return err
	}
	fd, err := unix.MemfdCreate("dsec-payload", 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, b); err != nil {
		return err
	}
	return execWait("/dev/fd/3", []string{"true"}, []uintptr{uintptr(fd)})
}

// exeReopen opens the executable of target (a pid, or "copy": a copy of
// this program started for the purpose) with O_PATH, waits for a copy to
// exit, and reopens the descriptor for writing.
func exeReopen(target string) error {
	pid := 0
	if target == "copy" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(self)
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "dsec-probe-exe")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cp := filepath.Join(dir, "probe")
		if err := os.WriteFile(cp, b, 0o755); err != nil {
			return err
		}
		cmd := exec.Command(cp, "listen-unix", filepath.Join(dir, "sock"))
		if err := cmd.Start(); err != nil {
			return err
		}
		defer cmd.Wait()
		defer cmd.Process.Kill()
		pid = cmd.Process.Pid
	} else {
		pid = atoi(target)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/exe", pid), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if target == "copy" {
		// Gone, so that its text is no longer busy.
		p, _ := os.FindProcess(pid)
		_ = p.Kill()
		for i := 0; i < 500; i++ {
			if err := unix.Kill(pid, 0); err != nil {
				break
			}
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, unix.WNOHANG, nil)
			time.Sleep(10 * time.Millisecond)
		}
	}
	w, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(w)
	}
	return err
}

// listenUnix serves a unix socket at path: every connection gets this
// process's effective uid ("euid=N") and stays open a second.
func listenUnix(path string) {
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Printf("listen=%s\n", errName(err))
		os.Exit(1)
	}
	_ = os.Chmod(path, 0o777)
	fmt.Println("listen=OK")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		fmt.Fprintf(c, "euid=%d\n", unix.Geteuid())
		go func() { time.Sleep(time.Second); c.Close() }()
	}
}

// inotify opens up to n inotify instances (counted per user namespace
// owner by the kernel: fs.inotify.max_user_instances) and prints how
// many it got and the error that stopped it. With hold, a sleep started
// with the instances keeps them after the probe exits.
func inotify(n int, hold bool) {
	var files []*os.File
	var err error
	for range n {
		var fd int
		fd, err = unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			break
		}
		files = append(files, os.NewFile(uintptr(fd), "inotify"))
	}
	fmt.Printf("inotify=%d\nerr=%s\n", len(files), errName(err))
	if hold {
		holdFiles(files)
	}
}

// mqueue creates up to n POSIX message queues of the default size (their
// bytes are counted per user namespace owner against RLIMIT_MSGQUEUE)
// and prints how many it got and the error that stopped it. Without
// hold it removes them; with hold they stay in the sandbox's IPC
// namespace, and their bytes stay counted.
func mqueue(n int, hold bool) {
	var names []string
	var err error
	for i := range n {
		name := fmt.Sprintf("dsec-probe-%d-%d", os.Getpid(), i)
		// The kernel's mq_open takes the name without libc's leading "/".
		fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, strPtr(name), uintptr(unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC), 0o600, 0, 0, 0)
		if err = errnoOf(e); err != nil {
			break
		}
		unix.Close(int(fd))
		names = append(names, name)
	}
	fmt.Printf("mqueue=%d\nerr=%s\n", len(names), errName(err))
	if !hold {
		for _, name := range names {
			unix.Syscall(unix.SYS_MQ_UNLINK, strPtr(name), 0, 0)
		}
	}
}

// holdFiles starts a sleep that holds files (its fds 3…) after the probe
// exits, and prints its pid.
func holdFiles(files []*os.File) {
	cmd := exec.Command("sleep", "3600")
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		fmt.Printf("held=%s\n", errName(err))
		return
	}
	fmt.Printf("held=%d\n", cmd.Process.Pid)
}
