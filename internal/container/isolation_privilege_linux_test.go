package container

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// runAs runs argv in sb as uid:gid (the agent's API; the sandbox's root
// cannot change users itself).
func runAs(t *testing.T, sb *Sandbox, uid, gid uint32, argv ...string) api.ExecResult {
	t.Helper()
	c, err := sb.agent.Client()
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(context.Background(), agentproto.ExecRequest{Argv: argv, User: agentproto.User{UID: uid, GID: gid}, TimeoutS: 30}, agentproto.Output{})
	if err != nil {
		t.Fatalf("%q as %d in %s: %v", argv, uid, sb.ID(), err)
	}
	return res
}

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

const noCaps = "0000000000000000"

// testPrivilege covers §3.6: privilege, signals, the agent.
func testPrivilege(t *testing.T, e *isoEnv, main *Sandbox) {
	ctx := context.Background()

	t.Run("A58_setuid", func(t *testing.T) {
		if res := run(t, main, sh(`find / -xdev \( -perm -4000 -o -perm -2000 \) -print`)...); strings.TrimSpace(res.Stdout) != "" {
			t.Errorf("setuid or setgid files in the image: %q", res.Stdout)
		}
		// Root makes a setuid-root program; a user runs it later.
		if res := run(t, main, sh("cp "+probePath+" /tmp/sp && chmod 4755 /tmp/sp && stat -c %A /tmp/sp")...); strings.TrimSpace(res.Stdout) != "-rwsr-xr-x" {
			t.Fatalf("making the setuid program: %+v", res)
		}
		e.auditedWhere(t, main, "setuid-bit", "allowed", "chmod 4755 /tmp/sp", func(ev api.AuditEvent) bool { return ev.Path == "/tmp/sp" })
		// The control: chmod 755 is no rule's.
		run(t, main, sh("cp /tmp/sp /tmp/sp-plain && chmod 755 /tmp/sp-plain")...)
		e.ruleless(t, main, "chmod 755", func(ev api.AuditEvent) bool {
			return ev.Path == "/tmp/sp-plain" && strings.Contains(ev.Syscall, "chmod")
		})
		got := parseKV(runAs(t, main, 1000, 1000, "/tmp/sp", "ids").Stdout)
		if got.get(t, "euid") != "1000" || got.get(t, "CapEff") != noCaps {
			t.Errorf("a user ran a setuid-root program: %v", got)
		}
		mounts := run(t, main, "cat", "/proc/self/mountinfo").Stdout
		for _, line := range strings.Split(mounts, "\n") {
			if f := strings.Fields(line); len(f) > 5 && f[4] == "/" && !strings.Contains(f[5], "nosuid") {
				t.Errorf("the root is mounted without nosuid: %s", line)
			}
		}
		// Negative control: the same program, setuid-root on the host,
		// run by the same uid.
		b, err := os.ReadFile(e.p.host)
		if err != nil {
			t.Fatal(err)
		}
		sp := filepath.Join(e.p.dir, "setuid-probe")
		if err := os.WriteFile(sp, b, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(sp)
		if err := os.Chmod(sp, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		host := e.hostProbeAs(t, sp, 1000, "ids")
		if host.get(t, "euid") != "0" {
			t.Errorf("negative control: the setuid program on the host runs as %v", host)
		}
	})

	t.Run("A59_file_capabilities", func(t *testing.T) {
		expect(t, "sandbox", probeIn(t, main, "sys", "setxattr-cap=/tmp/capx"), map[string][]string{"setxattr-cap:/tmp/capx": {"EPERM"}})
		e.auditedPath(t, main, "file-capability", "denied", "setxattr", "/tmp/capx")
		// The image's program with cap_setuid+ep, run by root and a user.
		if r := probeIn(t, main, "read", capProbePath); r[capProbePath+".fcaps"] == "" {
			t.Fatalf("the layer's %s carries no file capability: %v", capProbePath, r)
		}
		for _, uid := range []uint32{0, 1000} {
			got := parseKV(runAs(t, main, uid, uid, capProbePath, "ids").Stdout)
			if got.get(t, "CapEff") != noCaps || got.get(t, "CapPrm") != noCaps {
				t.Errorf("uid %d gained capabilities from a file: %v", uid, got)
			}
		}
		// Negative control: host root sets a file capability, and the same
		// program gives it to a user on the host.
		h := t.TempDir()
		expect(t, "host root (negative control)", e.hostProbe(t, nil, "sys", "setxattr-cap="+h+"/capx"), map[string][]string{"setxattr-cap:" + h + "/capx": {"OK"}})
		if host := e.hostProbeAs(t, e.p.capHost, 65534, "ids"); host.get(t, "CapEff") == noCaps {
			t.Errorf("negative control: the capability file gives nobody anything on the host: %v", host)
		}
	})

	t.Run("A62_signals", func(t *testing.T) {
		victim := e.create(t, "iso-kill", nil)
		start := func(sb *Sandbox) sandbox.Process {
			p, err := sb.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "300"}}})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		own, other := start(victim), start(main)
		defer other.Signal("KILL")
		res := run(t, victim, sh(fmt.Sprintf("kill -9 -1; kill -STOP 1; kill -9 1; kill -TERM 1; kill -SEGV 1; kill -0 %d 2>&1; echo rc=$?", os.Getpid()))...)
		if !strings.Contains(res.Stdout, "rc=1") {
			t.Errorf("the test process's pid from the sandbox: %+v", res)
		}
		if res := run(t, victim, "echo", "alive"); res.Stdout != "alive\n" {
			t.Errorf("the agent after kill -9 -1, -STOP 1, -9 1: %+v", res)
		}
		// (The audit event has no arguments: kill -1 and kill 1 are one rule.)
		e.audited(t, victim, "signal-init", "", "kill")
		// The control: kill -0 of the host's pid is no rule's.
		e.ruleless(t, victim, "kill -0 of another pid", func(ev api.AuditEvent) bool { return ev.Syscall == "kill" && ev.Result == -3 })
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", victim.state.Pid)); strings.Contains(string(st), ") T ") {
			t.Errorf("the agent is stopped: %s", st)
		}
		// Negative control: kill -1 did kill what the sandbox may kill; the
		// host's pid is there for the host.
		deadline := time.Now().Add(5 * time.Second)
		for own.Info().State != api.ProcessExited && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if info := own.Info(); info.State != api.ProcessExited {
			t.Errorf("negative control: the sandbox's own sleep survived kill -9 -1: %+v", info)
		}
		if err := syscall.Kill(os.Getpid(), 0); err != nil {
			t.Errorf("negative control: the host cannot signal the test process: %v", err)
		}
		if info := other.Info(); info.State != api.ProcessRunning {
			t.Errorf("the neighbour's process after kill -9 -1 next door: %+v", info)
		}
	})

	t.Run("A63_agent_tamper", func(t *testing.T) {
		sb := e.create(t, "iso-tamper", nil)
		guestExe, release, err := e.rt.findGuest(ctx, e.img.Layers)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		want := fileSHA256(t, guestExe)
		res := run(t, sb, sh(`cat /proc/1/exe >/dev/null 2>&1 && echo read-exe
			readlink /proc/1/exe >/dev/null 2>&1 && echo link-exe
			for f in /proc/1/fd/*; do readlink $f >/dev/null 2>&1 && echo link-fd; true < $f 2>/dev/null && echo open-fd; done
			cat /proc/1/environ >/dev/null 2>&1 && echo read-environ
			echo pwned > `+"/"+GuestPath+` && echo overwrote
			sha256sum `+"/"+GuestPath+`
			readlink /proc/self/exe`)...)
		for _, bad := range []string{"read-exe", "link-exe", "link-fd", "open-fd", "read-environ"} {
			if strings.Contains(res.Stdout, bad) {
				t.Errorf("the sandbox could %s of the agent:\n%s", bad, res.Stdout)
			}
		}
		expect(t, "sandbox", probeIn(t, sb, "sys", "openw=/proc/1/exe"), map[string][]string{"openw:/proc/1/exe": {"EACCES", "EPERM"}})
		e.auditedPath(t, sb, "process-tamper", "denied", "openat", "/proc/1/exe")
		e.auditedPath(t, sb, "agent-tamper", "allowed", "openat", "/"+GuestPath)
		// Negative control: the sandbox's own view of the binary changed,
		// and a dumpable process's exe link reads.
		if !strings.Contains(res.Stdout, "overwrote") || strings.Contains(res.Stdout, want) || !strings.Contains(res.Stdout, "/bin/busybox") {
			t.Errorf("negative control: %q", res.Stdout)
		}
		if got := fileSHA256(t, guestExe); got != want {
			t.Errorf("the agent binary on the host changed")
		}
		if res := run(t, sb, "echo", "alive"); res.Stdout != "alive\n" {
			t.Errorf("the agent after the overwrite: %+v", res)
		}
		fresh := e.create(t, "iso-tamper2", nil)
		if res := run(t, fresh, "sha256sum", "/"+GuestPath); !strings.Contains(res.Stdout, want) {
			t.Errorf("a new sandbox's agent binary: %q, want %s", res.Stdout, want)
		}

		// The agent's socket: no path in the sandbox leads to it.
		sock := filepath.Join(e.rt.sandboxDir(sb.ID()), "sock", setup.SockName)
		found := run(t, sb, sh(`find / -xdev -type s 2>/dev/null; awk 'NR>1 && $8 != "" {print $8}' /proc/net/unix`)...).Stdout
		for _, p := range strings.Fields(found) {
			if got := probeIn(t, sb, "unixconn", p); got["conn"] == "open" {
				t.Errorf("the sandbox connects to %s", p)
			}
		}
		if got := probeIn(t, sb, "unixconn", sock); got["conn"] == "open" {
			t.Errorf("the sandbox connects to the agent's socket path %s", sock)
		}
		// Negative control: the node connects; a process in the sandbox's
		// pid namespace that reaches the socket (here host root, entering
		// the namespace) is refused by the agent.
		if got := e.hostProbe(t, nil, "unixconn", sock); got["conn"] != "open" {
			t.Errorf("negative control: the node's connection: %v", got)
		}
		out := hostRun(t, nil, "nsenter", "--target", fmt.Sprint(sb.state.Pid), "--pid", "--", e.p.host, "unixconn", sock)
		if got := parseKV(out); got["conn"] != "closed" {
			t.Errorf("a peer inside the sandbox's pid namespace: %v", got)
		}
	})
}

// hostProbeAs runs a copy of the probe on the host as uid (gid the same).
func (e *isoEnv) hostProbeAs(t *testing.T, prog string, uid uint32, args ...string) kv {
	t.Helper()
	return parseKV(hostRun(t, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}, prog, args...))
}
