package container

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestPhases walks a sandbox through setup → coding → testing → submit:
// each change ends every process of the earlier phase (a root daemon and
// a writer holding a file open included), commands run as the phase's
// user, only the phase's paths are writable (even to root), and a
// writable path that leads out through a symlink is refused.
func TestPhases(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	rt := newRuntime(t, dir, runtimeOptions{pool: 2})
	ctx := context.Background()
	phases := []api.Phase{
		{Name: "setup"},
		{Name: "coding", Writable: []string{"/workspace"}, User: "1000"},
		{Name: "testing", Writable: []string{"/tmp"}, User: "1000:1000"},
		{Name: "submit", Writable: []string{}},
		{Name: "evil", Writable: []string{"/escape"}},
	}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "phased", Image: world.image(), Phases: phases})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	defer sb.Destroy(ctx)
	run := func(script string) api.ExecResult {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(script)}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	others := func() []int {
		procs, _ := sb.cg.Procs()
		return slices.DeleteFunc(procs, func(p int) bool { return p == sb.state.Pid })
	}
	// setup: root, everything writable; a daemon, a writer holding a
	// file on the root open, and a symlink out of the root mount.
	res := run(`id -u; mkdir -p /workspace && chmod 777 /workspace && ln -s /proc/self /escape &&
		(setsid sleep 1000 >/dev/null 2>&1 &) && (sh -c 'exec 3>/etc/held; while :; do sleep 1; done' >/dev/null 2>&1 &) && echo ok`)
	if res.Stdout != "0\nok\n" || res.Phase != "setup" {
		t.Fatalf("setup: %+v", res)
	}
	// The control: they run (and would stay).
	time.Sleep(100 * time.Millisecond)
	if n := len(others()); n < 2 {
		t.Fatalf("negative control: %d processes besides the agent after setup, want the daemon and the writer", n)
	}

	if err := sb.SetPhase(ctx, phases[1]); err != nil {
		t.Fatal(err)
	}
	if left := others(); len(left) != 0 {
		t.Errorf("processes of the setup phase survive into coding: %v", left)
	}
	res = run(`id -u; touch /workspace/ok && echo wrote; touch /tmp/x 2>&1; touch /etc/held 2>&1; true`)
	if !strings.HasPrefix(res.Stdout, "1000\nwrote\n") || strings.Count(res.Stdout, "Read-only file system") != 2 || res.Phase != "coding" {
		t.Errorf("coding: %+v", res)
	}

	if err := sb.SetPhase(ctx, phases[2]); err != nil {
		t.Fatal(err)
	}
	res = run(`touch /tmp/x && echo wrote; touch /workspace/y 2>&1; cat /workspace/ok && echo kept; true`)
	if !strings.HasPrefix(res.Stdout, "wrote\n") || !strings.Contains(res.Stdout, "Read-only file system") || !strings.Contains(res.Stdout, "kept") {
		t.Errorf("testing: %+v", res)
	}

	if err := sb.SetPhase(ctx, phases[3]); err != nil {
		t.Fatal(err)
	}
	res = run(`id -u; for f in /tmp/z /workspace/z /root/z; do touch $f 2>&1; done; true`)
	if !strings.HasPrefix(res.Stdout, "0\n") || strings.Count(res.Stdout, "Read-only file system") != 3 {
		t.Errorf("submit (root, nothing writable): %+v", res)
	}
	// A path through a symlink (to /proc) is refused, and the sandbox
	// stays as it was: nothing writable.
	err = sb.SetPhase(ctx, phases[4])
	if err == nil || !strings.Contains(err.Error(), "escape") {
		t.Fatalf("a writable path through a symlink: %v", err)
	}
	if sb.Phase() != "submit" {
		t.Errorf("phase after a refused change: %q", sb.Phase())
	}
	res = run(`touch /tmp/w 2>&1; true`)
	if !strings.Contains(res.Stdout, "Read-only file system") {
		t.Errorf("after a refused change: %+v", res)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPhaseDevReadOnly checks that /dev and /dev/shm, tmpfs mounts of
// the sandbox's own beside its root, follow the phase's writable paths:
// writable without a list, read-only with one (an empty one: nothing is
// writable), /dev/shm writable again when a list names it. They stayed
// writable whatever the phase said.
func TestPhaseDevReadOnly(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	phases := []api.Phase{
		{Name: "open"},
		{Name: "closed", Writable: []string{}},
		{Name: "shm", Writable: []string{"/tmp", "/dev/shm"}},
	}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "devro", Image: world.image(), Phases: phases})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	defer sb.Destroy(ctx)
	// One line per path: "w" if root could write a new file there, "ro"
	// if it was refused as read-only, else the error; and whether
	// /dev/null still takes writes (a device, not storage).
	probe := func() string {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(
			`for d in /dev/shm /dev /tmp; do
				if err=$(touch $d/f.$$ 2>&1); then echo "$d w"; rm -f $d/f.$$;
				else case "$err" in *Read-only*) echo "$d ro";; *) echo "$d $err";; esac; fi
			done; echo x > /dev/null && echo null`)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Stdout
	}
	for _, step := range []struct {
		phase int
		want  string
	}{
		{0, "/dev/shm w\n/dev w\n/tmp w\nnull\n"},
		{1, "/dev/shm ro\n/dev ro\n/tmp ro\nnull\n"},
		{2, "/dev/shm w\n/dev ro\n/tmp w\nnull\n"},
		{1, "/dev/shm ro\n/dev ro\n/tmp ro\nnull\n"},
		{0, "/dev/shm w\n/dev w\n/tmp w\nnull\n"},
	} {
		p := phases[step.phase]
		if sb.Phase() != p.Name {
			if err := sb.SetPhase(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		if got := probe(); got != step.want {
			t.Errorf("phase %s (writable %q):\n%s\nwant\n%s", p.Name, p.Writable, got, step.want)
		}
		// A terminal still opens (/dev/ptmx leads to the devpts mount).
		c, err := sb.agent.Client()
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, agentproto.ExecRequest{Argv: sh("tty"), PTY: &agentproto.PTYSize{Rows: 24, Cols: 80}}, agentproto.Output{})
		if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "/dev/pts/") {
			t.Errorf("phase %s: a command on a PTY: %v %+v", p.Name, err, res)
		}
	}
}
