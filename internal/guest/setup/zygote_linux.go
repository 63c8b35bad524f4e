package setup

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/dsec-dev/dsec/internal/sys"
)

// Zygote is `dsec-guest zygote`: a small process the container runtime
// starts once and asks to fork every sandbox's first process. A fork
// copies the forking process's page tables and makes it copy-on-write,
// and the node grows with every sandbox it tracks (124 MiB at 1,000
// here): forked from the node, each create cost more the more sandboxes
// ran. The zygote stays a few MiB. It serves requests (ZygoteRequest,
// with the descriptors of ZygoteFD* attached) one at a time on conn, a
// SOCK_SEQPACKET socket, answers each with a ZygoteReply, and exits when
// the node closes conn. It runs as the node's user, in the node's small
// mount namespace; its children are reaped by the kernel (SIGCHLD
// ignored) and watched by the node through /proc.
func Zygote(conn *os.File) int {
	// setns and the forks happen on this thread, the main one, whose
	// name is the process's (executed through a descriptor, it is "4").
	runtime.LockOSThread()
	_ = os.WriteFile("/proc/thread-self/comm", []byte("dsec-zygote"), 0)
	signal.Ignore(syscall.SIGCHLD)
	c, err := net.FileConn(conn)
	conn.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dsec-guest zygote: %v\n", err)
		return 1
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		fmt.Fprintf(os.Stderr, "dsec-guest zygote: fd 3 is not a unix socket\n")
		return 1
	}
	defer uc.Close()
	host, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		fmt.Fprintf(os.Stderr, "dsec-guest zygote: %v\n", err)
		return 1
	}
	// Each sandbox's first process starts on one CPU, in turn (see
	// zygoteStart); this thread keeps cpus.
	cpus, err := sys.ThreadCPUs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dsec-guest zygote: %v\n", err)
		return 1
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, sys.CmsgSpace(ZygoteFDs*4))
	for served := 0; ; served++ {
		if served%256 == 0 {
			// Every fork copies the page table entries of this process's
			// resident anonymous memory and every exec drops them: what
			// the heap has freed goes back to the kernel now and then.
			debug.FreeOSMemory()
		}
		n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return 0 // the node is gone
		}
		files, err := zygoteFiles(oob[:oobn])
		var reply ZygoteReply
		var child *sys.Pidfd
		stuck := false
		if err == nil {
			var req ZygoteRequest
			if err = json.Unmarshal(buf[:n], &req); err == nil {
				reply.Pid, child, stuck, err = zygoteStart(req, files, host, cpus, served)
				reply.Owner = req.Owner
			}
		}
		if err != nil {
			reply = ZygoteReply{Err: err.Error()}
		}
		for _, f := range files {
			f.Close()
		}
		b, _ := json.Marshal(reply)
		var rights []byte
		if child != nil {
			rights = sys.UnixRights(child.Fd())
		}
		_, _, err = uc.WriteMsgUnix(b, rights, nil)
		if child != nil {
			if err != nil {
				// The node will never learn of the process: it goes now,
				// not when its config pipe closes.
				_ = child.Kill()
			}
			child.Close()
		}
		if err != nil {
			return 0
		}
		if stuck {
			return 1 // in a sandbox's network: the node starts another
		}
	}
}

// zygoteFiles returns the descriptors of a request, in ZygoteFD* order.
func zygoteFiles(oob []byte) ([]*os.File, error) {
	msgs, err := sys.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("reading the request's descriptors: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := sys.ParseUnixRights(&m)
		if err != nil {
			return nil, fmt.Errorf("reading the request's descriptors: %w", err)
		}
		fds = append(fds, got...)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		sys.CloseOnExec(fd)
		files[i] = os.NewFile(uintptr(fd), "request")
	}
	if len(files) != ZygoteFDs {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("a request carries %d descriptors, want %d", len(files), ZygoteFDs)
	}
	return files, nil
}

// zygoteStart forks the sandbox's first process from this thread, joined
// to the sandbox's network namespace for the fork and with req.Owner as
// its effective uid (the owner of the process's user namespace, see
// sys.WithThreadEUID), and returns its pid and pidfd; stuck if the
// thread could not go back to the host's network or its own uid.
//
// The process starts on one of cpus (the n-th, in turn), and so do the
// threads it starts, until its setup lets them all run anywhere
// (SetupSandbox). The setup's last step changes the capabilities of
// every thread of the agent (capset is per thread): a stop-the-world
// that spins in sched_yield until each thread has run a signal handler.
// With the threads spread over CPUs busy with other sandboxes that
// spinning was a tenth of the agent's CPU at 8 creates in parallel; on
// one CPU, the threads it waits for are on the run queue it yields to.
func zygoteStart(req ZygoteRequest, f []*os.File, host *os.File, cpus []int, n int) (pid int, child *sys.Pidfd, stuck bool, err error) {
	if err := sys.SetThreadNetns(f[ZygoteFDNetns]); err != nil {
		return 0, nil, false, err
	}
	cmd := SandboxCommand(req, f[ZygoteFDConsole], []*os.File{f[ZygoteFDConfig], f[ZygoteFDSync], f[ZygoteFDConn], f[ZygoteFDRoot], f[ZygoteFDBinary]})
	pinned := len(cpus) > 1 && sys.SetThreadCPUs(cpus[n%len(cpus):n%len(cpus)+1]) == nil
	start := func() error { return StartSandbox(cmd, req) }
	if req.Owner != 0 {
		stuck, err = sys.WithThreadEUID(req.Owner, start)
	} else {
		err = start()
	}
	if cmd.Process != nil {
		child = CommandPidfd(cmd)
	}
	// Every way out below but the last kills the process it started:
	// the node hears nothing of it.
	fail := func(err error) (int, *sys.Pidfd, bool, error) {
		if child != nil {
			_ = child.Kill()
			child.Close()
		} else if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
		if cmd.Process != nil {
			_ = cmd.Process.Release()
		}
		return 0, nil, true, err
	}
	if stuck {
		return fail(err)
	}
	if pinned {
		if perr := sys.SetThreadCPUs(cpus); perr != nil {
			// Not fatal for the sandbox, which unpins itself; this
			// thread would pin every later one.
			return fail(errors.Join(err, fmt.Errorf("restoring the zygote's CPU affinity: %w", perr)))
		}
	}
	if rerr := sys.SetThreadNetns(host); rerr != nil {
		return fail(errors.Join(err, fmt.Errorf("back to the host's network: %w", rerr)))
	}
	if err != nil {
		child.Close()
		if cmd.Process != nil {
			_ = cmd.Process.Release() // killed by StartSandbox
		}
		return 0, nil, false, err
	}
	// The kernel reaps the process; what os.Process holds for it (a
	// pidfd) must go now, not when a GC finds it unreachable: the zygote
	// allocates so little that it held ~1,000 of them, and every fork
	// copied them and every exec closed them (~8 % of its CPU). Its own
	// pidfd (CommandPidfd) goes to the node with the answer.
	pid = cmd.Process.Pid
	_ = cmd.Process.Release()
	return pid, child, false, nil
}

// StartSandbox starts cmd, a SandboxCommand of req, and sets its open
// files limit to req.Nofile. The caller runs it with req.Owner as the
// thread's effective uid: the owner of the process's user namespace
// holds every capability over it, CAP_SYS_RESOURCE included, which
// prlimit of another user's process needs and host root may lack (this
// machine's bounding set has none). A process whose limit cannot be set
// is killed, and the error returned.
func StartSandbox(cmd *exec.Cmd, req ZygoteRequest) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	if req.Nofile == 0 {
		return nil
	}
	if err := sys.SetNofile(cmd.Process.Pid, req.Nofile); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	return nil
}

// CommandPidfd is the pidfd of a started SandboxCommand (nil if the
// kernel made none), for the caller to close.
func CommandPidfd(cmd *exec.Cmd) *sys.Pidfd {
	if p := cmd.SysProcAttr.PidFD; p != nil && *p >= 0 {
		return sys.PidfdFromFD(*p)
	}
	return nil
}

// SandboxCommand is a sandbox's first process: `dsec-guest sandbox`
// executed from its layer file's descriptor (extra[4], fd 7 in the
// child) in new user, mount, pid, uts and ipc namespaces, as root of the
// user namespace mapped to req's host ids (host root is not mapped, and
// a process running as an unmapped uid has no capabilities there), in a
// session of its own and with no parent-death signal (a sandbox outlives
// the node service). extra become fds 3–7, the console its stdout and
// stderr; nothing else is inherited. Started, it has a pidfd
// (CommandPidfd). The caller makes req.Owner the forking thread's
// effective uid (zygoteStart).
func SandboxCommand(req ZygoteRequest, console *os.File, extra []*os.File) *exec.Cmd {
	cmd := exec.Command("/proc/self/fd/7", "sandbox")
	cmd.Args[0] = "dsec-guest"
	// One P: the agent is mostly idle, and fewer threads and heaps keep
	// its memory down (commands never see this environment).
	cmd.Env = []string{"GOMAXPROCS=1"}
	if req.Node != "" {
		cmd.Env = append(cmd.Env, NodeEnv+"="+req.Node)
	}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = console, console
	cmd.ExtraFiles = extra
	flags := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
		syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC)
	if req.NewNet {
		flags |= syscall.CLONE_NEWNET
	}
	pidfd := -1
	cmd.SysProcAttr = &syscall.SysProcAttr{
		PidFD:                      &pidfd,
		Cloneflags:                 flags,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: req.UID, Size: req.Count}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: req.GID, Size: req.Count}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		Setsid:                     true,
	}
	return cmd
}
