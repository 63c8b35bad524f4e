package container

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// testSeam covers §3.1: the runtime seam and file-system escapes.
func testSeam(t *testing.T, e *isoEnv, main *Sandbox) {
	ctx := context.Background()

	t.Run("A2_cwd_proc_fd", func(t *testing.T) {
		// From wherever a command starts, walk up and read the host's
		// secret: it works only from a directory outside the sandbox.
		script := "cat " + strings.Repeat("../", 24) + e.secretRel + " 2>/dev/null; echo"
		// The node holds a host directory without close-on-exec while it
		// creates the sandbox (as a descriptor its own parent leaked to it
		// would be): exec passes it to the sandbox's first process, the
		// agent (CVE-2024-21626: runc leaked a cgroupfs directory so).
		leak, err := syscall.Open(filepath.Dir(e.secretPath), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		sb := e.create(t, "iso-leak", nil)
		syscall.Close(leak)
		agentFds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", sb.state.Pid))
		for _, fd := range agentFds {
			if target, _ := os.Readlink(fd); target == filepath.Dir(e.secretPath) {
				t.Errorf("the agent holds the node's directory %s as %s", target, fd)
			}
		}
		cwds := []string{"/proc/1/cwd", "/proc/1/root", "/proc/self/cwd", "/proc/self/root"}
		for n := 0; n <= 20; n++ {
			cwds = append(cwds, fmt.Sprintf("/proc/self/fd/%d", n), fmt.Sprintf("/proc/1/fd/%d", n))
		}
		cwds = append(cwds, fmt.Sprintf("/proc/self/fd/%d", leak))
		accepted := 0
		for _, cwd := range cwds {
			res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(script), Cwd: cwd, TimeoutS: 10}})
			if err != nil {
				continue // refused: safe
			}
			accepted++
			if strings.Contains(res.Stdout, e.secret) {
				t.Errorf("a command started in %s read the host's secret", cwd)
			}
		}
		t.Logf("%d of %d working directories through /proc accepted (none leads out)", accepted, len(cwds))
		// Inside, through the command's own descriptors.
		res := run(t, sb, sh(`for n in $(seq 0 20); do (cd /proc/self/fd/$n 2>/dev/null && `+script+`); done`)...)
		if strings.Contains(res.Stdout, e.secret) {
			t.Errorf("cd /proc/self/fd/N reaches the host: %q", res.Stdout)
		}
		// Negative control: the same walk from a descriptor of a host
		// directory a process inherited.
		dir, err := os.Open(filepath.Dir(e.secretPath))
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		cmd := exec.Command("/bin/sh", "-c", "cd /proc/self/fd/3 && "+script)
		cmd.ExtraFiles = []*os.File{dir}
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), e.secret) {
			t.Errorf("negative control: the walk from an inherited directory did not read the secret (%v): %q", err, out)
		}
	})

	t.Run("A3_inherited_fds", func(t *testing.T) {
		std := regexp.MustCompile(`^(pipe:\[\d+\]|/dev/null|/dev/pts/\d+)$`)
		checkFds := func(path, out string) {
			t.Helper()
			m := parseKV(out)
			if m.get(t, "count") != "3" {
				t.Errorf("%s: a command inherited %s descriptors, want 3 (stdin, stdout, stderr):\n%s", path, m["count"], out)
			}
			for fd := range 3 {
				if v := m.get(t, "fd"+strconv.Itoa(fd)); !std.MatchString(v) {
					t.Errorf("%s: fd %d is %q", path, fd, v)
				}
			}
		}
		checkFds("exec", run(t, main, probePath, "fds").Stdout)
		checkFds("exec with stdin", runReq(t, main, api.ExecRequest{Cmd: []string{probePath, "fds"}, Stdin: "x"}).Stdout)
		p, err := main.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{probePath, "fds"}}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkFds("background", res.Stdout)
		c, err := main.agent.Client()
		if err != nil {
			t.Fatal(err)
		}
		res, err = c.Exec(ctx, agentproto.ExecRequest{Argv: []string{probePath, "fds"}, PTY: &agentproto.PTYSize{Rows: 24, Cols: 80}}, agentproto.Output{})
		if err != nil {
			t.Fatal(err)
		}
		checkFds("pty", res.Stdout)
		// Negative control: a descriptor the parent leaks is seen.
		f, err := os.Open(main.dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command(e.p.host, "fds")
		cmd.ExtraFiles = []*os.File{f}
		out, err := cmd.Output()
		if m := parseKV(string(out)); err != nil || m["fd3"] != main.dir {
			t.Errorf("negative control: a leaked directory descriptor went unseen (%v): %q", err, out)
		}
	})

	t.Run("A4_mount", func(t *testing.T) {
		calls := []string{"mount-tmpfs:/tmp/m1", "mount-bind:/,/tmp/m2", "mount-proc:/tmp/m3", "mount-cgroup:/tmp/m4"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		if res := run(t, main, "mount", "-t", "tmpfs", "x", "/tmp"); res.ExitCode == 0 {
			t.Errorf("busybox mount succeeded: %+v", res)
		}
		e.audited(t, main, "mount", "denied", "mount")
		h := t.TempDir()
		host := []string{"mount-tmpfs:" + h + "/m1", "mount-bind:/," + h + "/m2", "mount-proc:" + h + "/m3"}
		expect(t, "host root in a mount namespace (negative control)", e.hostProbe(t, privateMounts, sysArgs(host...)...), all(host, "OK"))
	})

	t.Run("A5_unmask", func(t *testing.T) {
		calls := []string{"umount:/proc/kallsyms", "umount:/proc/keys", "umount:/proc/sys", "umount:/sys/firmware", "umount:/sys/fs/cgroup", "umount:/sys"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		e.audited(t, main, "mount", "denied", "umount2")
		after := probeIn(t, main, "read", "/proc/kallsyms", "/sys/firmware")
		if after.get(t, "/proc/kallsyms.bytes") != "0" || after.get(t, "/sys/firmware.entries") != "0" {
			t.Errorf("masks after the attempts: %v", after)
		}
		expect(t, "sandbox", probeIn(t, main, "sys", "openw=/proc/sys/kernel/hostname"), map[string][]string{"openw:/proc/sys/kernel/hostname": {"EROFS", "EACCES"}})
		// Negative control: a mask of the same kind (/dev/null bound
		// over a file), undone by host root.
		f := filepath.Join(t.TempDir(), "masked")
		if err := os.WriteFile(f, []byte("unmasked"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := hostRun(t, privateMounts, "/bin/sh", "-c", `mount --bind /dev/null "$1" && exec "$2" sys umount="$1"`, "sh", f, e.p.host)
		expect(t, "host root (negative control)", parseKV(out), map[string][]string{"umount:" + f: {"OK"}})
	})

	t.Run("A6_chroot_pivot_root", func(t *testing.T) {
		before := run(t, main, "stat", "-c", "%d:%i", "/").Stdout
		calls := []string{"chroot:/tmp/cx", "pivot-root:/tmp/pr"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		if res := run(t, main, "chroot", "/tmp/cx", "/bin/true"); res.ExitCode == 0 {
			t.Errorf("busybox chroot succeeded: %+v", res)
		}
		e.audited(t, main, "mount", "denied", "chroot", "pivot_root")
		if after := run(t, main, "stat", "-c", "%d:%i", "/").Stdout; after != before {
			t.Errorf("the sandbox's root changed: %q → %q", before, after)
		}
		h := t.TempDir()
		for _, c := range []string{"chroot:" + h + "/cx", "pivot-root:" + h + "/pr"} {
			expect(t, "host root in a mount namespace (negative control)", e.hostProbe(t, privateMounts, sysArgs(c)...), map[string][]string{c: {"OK"}})
		}
	})

	t.Run("A7_unshare_userns", func(t *testing.T) {
		res := run(t, main, sh("unshare -Urmn sh -c 'mount -t tmpfs x /tmp && echo nested-mount-ok'")...)
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "nested-mount-ok") || !strings.Contains(res.Stderr, "not permitted") {
			t.Errorf("unshare -Urmn in the sandbox: %+v", res)
		}
		calls := []string{"clone-newuser:/bin/true", "unshare-net", "unshare-mnt"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		e.audited(t, main, "namespace", "denied", "unshare")
		nested := []string{"nested", "sys", "mount-tmpfs=/tmp/nested", "unshare-net"}
		if got := probeIn(t, main, nested...); got.get(t, "clone") != "EPERM" || got["mount-tmpfs:/tmp/nested"] != "" {
			t.Errorf("a nested user namespace in the sandbox: %v", got)
		}
		// Negative control: without seccomp the sandbox makes a nested
		// user namespace, and holding CAP_SYS_ADMIN there it mounts and
		// makes network namespaces.
		got := probeIn(t, e.noSec, nested...)
		expect(t, "sandbox without seccomp (negative control)", got, map[string][]string{
			"clone": {"OK"}, "mount-tmpfs:/tmp/nested": {"OK"}, "unshare-net": {"OK"},
		})
		expect(t, "sandbox without seccomp (negative control)", probeIn(t, e.noSec, "sys", "clone-newuser=/bin/true"), map[string][]string{"clone-newuser:/bin/true": {"OK"}})
	})

	t.Run("A8_setns", func(t *testing.T) {
		calls := []string{"setns:/proc/1/ns/net", "setns:/proc/1/ns/uts", "setns:/proc/1/ns/mnt", "setns:/proc/self/ns/net", "setns:/proc/self/ns/uts"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM", "EACCES"))
		e.audited(t, main, "namespace", "denied", "setns")
		if res := run(t, main, "nsenter", "-t", "1", "-m", "-u", "-n", "-p", "true"); res.ExitCode == 0 {
			t.Errorf("nsenter -t 1 succeeded: %+v", res)
		}
		ps := probeIn(t, main, "procs", e.marker)
		if ps.get(t, "marker."+e.marker) != "false" {
			t.Errorf("the sandbox sees the test process: %v", ps)
		}
		if n, _ := strconv.Atoi(ps["procs"]); n > 20 {
			t.Errorf("the sandbox sees %d processes", n)
		}
		// Negative control: host root joins namespaces (its own: harmless)
		// and sees the test process.
		host := []string{"setns:/proc/self/ns/net", "setns:/proc/self/ns/uts"}
		expect(t, "host root (negative control)", e.hostProbe(t, nil, sysArgs(host...)...), all(host, "OK"))
		if hp := e.hostProbe(t, nil, "procs", e.marker); hp.get(t, "marker."+e.marker) != "true" {
			t.Errorf("negative control: the host does not see the test process: %v", hp)
		}
	})

	t.Run("A9_cgroup_release_agent", func(t *testing.T) {
		calls := []string{"mount-cgroup:/tmp/cg", "mount-cgroup:/tmp/cg2,pids", "mount-cgroup:/tmp/cg3,memory"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		if res := run(t, main, sh("find /sys /proc -maxdepth 4 -name release_agent 2>/dev/null")...); strings.TrimSpace(res.Stdout) != "" {
			t.Errorf("release_agent files in the sandbox: %q", res.Stdout)
		}
		writes := []string{"write:/sys/fs/cgroup/notify_on_release,1", "write:/sys/fs/cgroup/release_agent,/tmp/x", "mkdir:/sys/fs/cgroup/x"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(writes...)...), all(writes, "EROFS", "ENOENT", "EACCES"))
		e.auditedPath(t, main, "mount", "denied", "mount", "/tmp/cg2")
		e.auditedPath(t, main, "release-agent", "", "openat", "/sys/fs/cgroup/release_agent")
		e.auditedPath(t, main, "release-agent", "", "openat", "/sys/fs/cgroup/notify_on_release")
		// Negative control: host root mounts the pids hierarchy (in a
		// mount namespace of its own) and finds release_agent at its root.
		h := t.TempDir()
		out := hostRun(t, privateMounts, "/bin/sh", "-c", `"$1" sys mount-cgroup="$2",pids && test -f "$2"/release_agent && echo release_agent=found`, "sh", e.p.host, h)
		expect(t, "host root in a mount namespace (negative control)", parseKV(out), map[string][]string{"mount-cgroup:" + h + ",pids": {"OK"}, "release_agent": {"found"}})
	})

	t.Run("A10_sysctl", func(t *testing.T) {
		const core = "/proc/sys/kernel/core_pattern"
		before, err := os.ReadFile(core)
		if err != nil {
			t.Fatal(err)
		}
		calls := []string{"write:" + core + ",|/tmp/x", "openw:" + core, "openw:/proc/sys/kernel/modprobe", "openw:/proc/sys/vm/overcommit_memory"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), map[string][]string{
			// Files of the host's root: not the sandbox root's to write
			// (EACCES), on a read-only mount besides (EROFS).
			calls[0]: {"EROFS", "EACCES"}, calls[1]: {"EROFS", "EACCES"}, calls[2]: {"EROFS", "EACCES", "ENOENT"}, calls[3]: {"EROFS", "EACCES"},
		})
		if res := run(t, main, "sysctl", "-w", "kernel.core_pattern=|/tmp/x"); res.ExitCode == 0 {
			t.Errorf("sysctl -w succeeded: %+v", res)
		}
		e.auditedPath(t, main, "sysctl-write", "denied", "openat", core)
		e.auditedPath(t, main, "sysctl-write", "", "openat", "/proc/sys/vm/overcommit_memory")
		if after, _ := os.ReadFile(core); string(after) != string(before) {
			t.Errorf("the host's core_pattern changed: %q → %q", before, after)
		}
		// Negative control: host root may open them for writing (and
		// writes nothing).
		host := []string{"openw:" + core, "openw:/proc/sys/vm/overcommit_memory"}
		expect(t, "host root (negative control)", e.hostProbe(t, nil, sysArgs(host...)...), all(host, "OK"))
	})

	t.Run("A11_sysrq_and_triggers", func(t *testing.T) {
		// Host-wide triggers: the kernel's sysrq (absent on kernels without
		// CONFIG_MAGIC_SYSRQ, this one included) and the VM's.
		calls := []string{"openw:/proc/sys/vm/drop_caches", "openw:/proc/sys/vm/compact_memory"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EROFS", "EACCES"))
		e.auditedPath(t, main, "sysctl-write", "denied", "openat", "/proc/sys/vm/drop_caches")
		expect(t, "host root (negative control)", e.hostProbe(t, nil, sysArgs(calls...)...), all(calls, "OK"))
		const sysrq = "/proc/sysrq-trigger"
		in := probeIn(t, main, "read", sysrq)
		if _, err := os.Stat(sysrq); err != nil {
			if in.get(t, sysrq) != "ENOENT" {
				t.Errorf("%s is absent on the host but reads %v in the sandbox", sysrq, in)
			}
			t.Logf("this kernel has no %s: nothing to mask", sysrq)
			return
		}
		// Masked with /dev/null: a write goes nowhere.
		if got := in.get(t, sysrq); got != "chr:1:3" {
			t.Errorf("%s in the sandbox is %q, want /dev/null (chr:1:3)", sysrq, got)
		}
		if host := e.hostProbe(t, nil, "read", sysrq); host.get(t, sysrq) != "reg" {
			t.Errorf("negative control: the host's %s is %v", sysrq, host)
		}
	})

	t.Run("A12_sys", func(t *testing.T) {
		writes := []string{"openw:/sys/kernel/rcu_expedited", "openw:/sys/kernel/rcu_normal", "mkdir:/sys/fs/cgroup/dsec-probe", "mkdir:/sys/kernel/dsec-probe"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(writes...)...), all(writes, "EROFS", "EACCES"))
		e.auditedPath(t, main, "sysfs-write", "denied", "openat", "/sys/kernel/rcu_expedited")
		expect(t, "host root (negative control)", e.hostProbe(t, nil, sysArgs(writes[:2]...)...), all(writes[:2], "OK"))
		masked := []string{"/sys/firmware", "/sys/kernel/security", "/sys/kernel/debug", "/sys/kernel/tracing", "/sys/fs/bpf", "/sys/devices/virtual/powercap", "/sys/fs/cgroup"}
		in := probeIn(t, main, append([]string{"read"}, masked...)...)
		host := e.hostProbe(t, nil, append([]string{"read"}, masked...)...)
		differs := 0
		for _, p := range masked {
			if host[p] != "dir" {
				t.Logf("%s: absent on this host (%s)", p, host[p])
				continue
			}
			if got := in[p+".entries"]; got != "0" {
				t.Errorf("%s lists %s entries in the sandbox, want 0 (masked)", p, got)
			}
			if host[p+".entries"] != "0" {
				differs++
			}
		}
		if differs == 0 {
			t.Errorf("negative control: no masked directory lists anything on the host: %v", host)
		}
	})

	t.Run("A13_proc_leaks", func(t *testing.T) {
		paths := []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/interrupts", "/proc/kallsyms", "/proc/latency_stats", "/proc/timer_stats"}
		in := probeIn(t, main, append([]string{"read"}, paths...)...)
		host := e.hostProbe(t, nil, append([]string{"read"}, paths...)...)
		compared := 0
		for _, p := range paths {
			if host[p] == "ENOENT" {
				if in[p] != "ENOENT" {
					t.Errorf("%s: absent on the host, %v in the sandbox", p, in[p])
				}
				continue
			}
			compared++
			if in.get(t, p+".bytes") != "0" {
				t.Errorf("%s: the sandbox reads %s bytes (%s), want none", p, in[p+".bytes"], in[p])
			}
			if host.get(t, p+".bytes") == "0" {
				t.Errorf("negative control: host root reads nothing from %s", p)
			}
		}
		if compared == 0 {
			t.Fatal("none of the paths exists on this host")
		}
	})

	t.Run("A14_mknod", func(t *testing.T) {
		calls := []string{"mknod-blk:/tmp/sda", "mknod-chr:/tmp/mem"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		if res := run(t, main, "mknod", "/tmp/sdb", "b", "8", "0"); res.ExitCode == 0 {
			t.Errorf("busybox mknod succeeded: %+v", res)
		}
		for _, p := range []string{"/tmp/sda", "/tmp/mem", "/tmp/sdb"} {
			e.auditedWhere(t, main, "device-node", "denied", "mknod "+p, func(ev api.AuditEvent) bool { return ev.Path == p })
		}
		// The control: a FIFO is no device.
		run(t, main, "mkfifo", "/tmp/fifo")
		e.ruleless(t, main, "mknod of a FIFO", func(ev api.AuditEvent) bool { return ev.Path == "/tmp/fifo" && strings.HasPrefix(ev.Syscall, "mknod") })
		// /dev holds only the harmless devices.
		devs := strings.Fields(run(t, main, "ls", "/dev").Stdout)
		want := []string{"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
		if strings.Join(devs, " ") != strings.Join(want, " ") {
			t.Errorf("/dev holds %q, want %q", devs, want)
		}
		h := t.TempDir()
		host := []string{"mknod-blk:" + h + "/sda", "mknod-chr:" + h + "/mem"}
		expect(t, "host root (negative control)", e.hostProbe(t, nil, sysArgs(host...)...), all(host, "OK"))
	})

	t.Run("A15_open_by_handle_at", func(t *testing.T) {
		calls := []string{"open-by-handle:/", "open-by-handle:/tmp"}
		expect(t, "sandbox", probeIn(t, main, sysArgs(calls...)...), all(calls, "EPERM"))
		e.audited(t, main, "open-by-handle", "denied", "open_by_handle_at")
		expect(t, "host root (negative control)", e.hostProbe(t, nil, "sys", "open-by-handle=/"), map[string][]string{"open-by-handle:/": {"OK"}})
	})
}
