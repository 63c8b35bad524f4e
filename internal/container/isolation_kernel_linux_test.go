package container

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sys"
)

// testKernel covers §3.2: the kernel's attack surface, in the
// try-syscall style (bad pointers and descriptors where a call that got
// through could do harm), against host root or a sandbox without
// seccomp.
func testKernel(t *testing.T, e *isoEnv, main *Sandbox) {
	// syscallCase is one row of the matrix: calls, what the sandbox must
	// get, and where the negative control runs (the host as root unless
	// inSandbox names other calls of the same sandbox that must differ).
	// and the audit rule the refusals must hit, for each system call.
	type syscallCase struct {
		name     string
		calls    []string
		want     []string
		rule     string
		syscalls []string
	}
	for _, c := range []syscallCase{
		{"A19_kernel_modules", []string{"finit-module", "init-module", "delete-module"}, []string{"EPERM"}, "kernel-module", []string{"finit_module", "init_module", "delete_module"}},
		{"A21_bpf", []string{"bpf-prog-load", "bpf-map-create"}, []string{"EPERM"}, "bpf", []string{"bpf"}},
		{"A22_perf_event_open", []string{"perf-event-open"}, []string{"EPERM"}, "perf-event", []string{"perf_event_open"}},
		{"A24_userfaultfd", []string{"userfaultfd"}, []string{"EPERM"}, "userfaultfd", []string{"userfaultfd"}},
		{"A25_keyrings", []string{"keyctl", "add-key", "request-key"}, []string{"EPERM"}, "keyring", []string{"keyctl", "add_key", "request_key"}},
		{"A26_clock", []string{"clock-settime", "settimeofday", "adjtime-tick"}, []string{"EPERM"}, "clock-change", []string{"clock_settime", "settimeofday", "clock_adjtime"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			expect(t, "sandbox", probeIn(t, main, sysArgs(c.calls...)...), all(c.calls, c.want...))
			e.audited(t, main, c.rule, "denied", c.syscalls...)
			expectNot(t, "host root", e.hostProbe(t, nil, sysArgs(c.calls...)...), c.calls, c.want...)
		})
	}

	t.Run("A19_modules_unchanged", func(t *testing.T) {
		before, errBefore := os.ReadFile("/proc/modules")
		if res := run(t, main, sh("head -c 4096 /dev/urandom > /tmp/x.ko; insmod /tmp/x.ko; modprobe dccp; modprobe tipc")...); res.ExitCode == 0 {
			t.Errorf("insmod/modprobe in the sandbox: %+v", res)
		}
		after, errAfter := os.ReadFile("/proc/modules")
		if string(before) != string(after) || (errBefore == nil) != (errAfter == nil) {
			t.Errorf("the host's modules changed:\n%s\n→\n%s", before, after)
		}
	})

	t.Run("A20_module_autoload", func(t *testing.T) {
		// Families a kernel with modules autoloads on socket() (no
		// capability needed: request_module("net-pf-N")), and others
		// rarely used: TIPC, RDS, CAN, Bluetooth, PF_KEY, XDP, vsock,
		// AF_ALG; socketpair reaches the same code.
		calls := []string{"socket:30,1,0", "socket:21,5,0", "socket:29,3,1", "socket:31,1,0", "socket:15,3,2",
			"socket:44,3,0", "socket:40,1,0", "socket:38,5,0", "socket:26,2,0", "socketpair:30,1", "socketpair:21,5"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		e.audited(t, main, "socket-refused", "denied", "socket", "socketpair")
		expectNot(t, "host root", e.hostProbe(t, nil, sysArgs(calls...)...), calls, "EPERM")
		// What a sandbox needs still works.
		usual := []string{"socket:1,1,0", "socket:2,1,0", "socket:2,2,0", "socket:10,1,0", "socket:16,3,0", "socketpair:1,1", "socketpair:1,2"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(usual...)...), all(usual, "OK", "EAFNOSUPPORT"))
		// Link types autoload too (rtnl-link-<kind>), behind CAP_NET_ADMIN.
		link := []string{"ip", "link", "add", "dsecx", "type", "veth", "peer", "name", "dsecy"}
		if res := run(t, main, link...); res.ExitCode == 0 || !strings.Contains(res.Stderr, "not permitted") {
			t.Errorf("ip link add in the sandbox: %+v", res)
		}
		// Negative control: host root in a network namespace of its own.
		hostRun(t, &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNET}, "/bin/busybox", link...)
	})

	t.Run("A23_ptrace_agent", func(t *testing.T) {
		// The agent (PID 1) against a child of the probe's own: same uid,
		// same sandbox, only the target differs.
		agent := []string{"ptrace-attach:1", "process-vm-readv:1", "pidfd-getfd:1", "kcmp:1"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(agent...)...), all(agent, "EPERM", "EACCES"))
		e.audited(t, main, "ptrace", "denied", "ptrace", "process_vm_readv", "pidfd_getfd", "kcmp")
		child := probeIn(t, main, "sys", "ptrace-attach=child", "process-vm-readv=child")
		expect(t, "a child in the sandbox (negative control)", child, map[string][]string{
			"ptrace-attach:child": {"OK"}, "process-vm-readv:child": {"EFAULT"},
		})
		// pidfd_getfd (stealing a descriptor: the agent's connection to
		// the node) and kcmp need CAP_SYS_PTRACE in the filter: host root
		// uses them on a child of its own.
		hostCalls := []string{"pidfd-getfd:child", "kcmp:child"}
		expectNot(t, "host root", e.hostProbe(t, nil, sysArgs(hostCalls...)...), hostCalls, "EPERM", "EACCES")
		if st := run(t, main, "grep", "TracerPid", "/proc/1/status").Stdout; !strings.Contains(st, "\t0") {
			t.Errorf("the agent is traced: %q", st)
		}
	})

	t.Run("A27_clone3_personality_tiocsti", func(t *testing.T) {
		calls := []string{"clone3", "personality:0x40000"}
		got := probeIn(t, main, sysArgs(append(calls, "personality:0xffffffff")...)...)
		expect(t, "sandbox", got, map[string][]string{"clone3": {"ENOSYS"}, "personality:0x40000": {"EPERM"}, "personality:0xffffffff": {"OK"}})
		// (clone3's flags are behind a pointer the monitor does not read:
		// the refusal of personality is what is seen.)
		e.audited(t, main, "personality-refused", "denied", "personality")
		expectNot(t, "host root", e.hostProbe(t, nil, sysArgs(calls...)...), calls, "ENOSYS", "EPERM")
		// No controlling terminal shared with anything outside the
		// command: without a PTY there is none at all.
		expect(t, "sandbox", probeIn(t, main, "tty"), map[string][]string{
			"open-tty": {"ENXIO"}, "tiocsti": {"ENOTTY"}, "tiocsti-high": {"ENOTTY"},
		})
		// With a PTY the terminal is the command's own, in a session of
		// its own.
		c, err := main.agent.Client()
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(context.Background(), agentproto.ExecRequest{Argv: sh(`test "$(cut -d' ' -f6 /proc/$$/stat)" = $$ && echo own-session`), PTY: &agentproto.PTYSize{Rows: 24, Cols: 80}}, agentproto.Output{})
		if err != nil || !strings.Contains(res.Stdout, "own-session") {
			t.Errorf("a PTY command's session: %v %+v", err, res)
		}
		// Negative control: a process whose controlling terminal it shares
		// (as bubblewrap's sandbox shared the caller's) pushes input into
		// it, with the high bits set too.
		master, tty, err := sys.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		defer master.Close()
		defer tty.Close()
		cmd := exec.Command(e.p.host, "tty")
		cmd.Stdin, cmd.Stderr = tty, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		host := parseKV(string(out))
		expect(t, "host process on a terminal (negative control)", host, map[string][]string{"open-tty": {"OK"}})
		if b, err := os.ReadFile("/proc/sys/dev/tty/legacy_tiocsti"); err != nil || strings.TrimSpace(string(b)) == "1" {
			expect(t, "host process on a terminal (negative control)", host, map[string][]string{"tiocsti": {"OK"}, "tiocsti-high": {"OK"}})
		}
	})

	t.Run("A28_every_thread_filtered", func(t *testing.T) {
		check := func(sb *Sandbox, wantSeccomp string) {
			t.Helper()
			filtered := wantSeccomp != "0"
			out := run(t, sb, probePath, "tasks").Stdout
			n := 0
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := fieldsKV(line)
				n++
				if f["seccomp"] != wantSeccomp || filtered && f["nnp"] != "1" {
					t.Errorf("%s: %s", sb.ID(), line)
				}
				if filtered && f["pid"] != "1" && f["capeff"] != "0000000000000000" {
					t.Errorf("%s: a task with capabilities: %s", sb.ID(), line)
				}
			}
			if n < 6 { // the agent's threads and the probe's
				t.Errorf("%s: only %d tasks:\n%s", sb.ID(), n, out)
			}
		}
		check(main, "2")
		// Negative control: the runtime without a filter (where only
		// the thread that forks commands sets no_new_privs).
		check(e.noSec, "0")
	})
}
