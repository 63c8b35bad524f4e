package container

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestPhaseCapabilities: a phase's commands hold exactly its
// capabilities, as root or as another user (CapEff reads them; uid 1000
// binds port 80 only with CAP_NET_BIND_SERVICE), the bounding set is the
// union of the phases', and capabilities that cannot be granted are
// refused.
func TestPhaseCapabilities(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		spec sandbox.Spec
		code string
	}{
		{"not grantable", sandbox.Spec{Capabilities: []string{"CAP_SYS_ADMIN"}}, "invalid_capability"},
		{"unknown", sandbox.Spec{Phases: []api.Phase{{Name: "a", Capabilities: []string{"cap_fly"}}}}, "invalid_capability"},
		{"beyond the sandbox's", sandbox.Spec{Capabilities: []string{"chown"}, Phases: []api.Phase{{Name: "a", Capabilities: []string{"net_bind_service"}}}}, "capability_not_in_sandbox"},
	} {
		tc.spec.ID, tc.spec.Image = "badcaps", world.image()
		if _, err := rt.Create(ctx, tc.spec); errdefs.CodeOf(err) != tc.code {
			t.Errorf("%s: Create: %v, want code %s", tc.name, err, tc.code)
		}
	}
	phases := []api.Phase{
		{Name: "setup"},
		{Name: "plain", User: "1000"},
		{Name: "granted", User: "1000", Capabilities: []string{"dac_override", "net_bind_service"}},
		{Name: "root", Capabilities: []string{"CAP_CHOWN"}},
	}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "capphases", Image: world.image(), Phases: phases})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	defer sb.Destroy(ctx)
	// Ports: the sandbox's network namespace lets anyone bind port 80
	// (ip_unprivileged_port_start=0), so reading a file only root may
	// read shows CAP_DAC_OVERRIDE at work instead.
	const probe = `grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status | tr -s '\t' ' '; id -u; cat /secret 2>/dev/null || echo denied`
	want := map[string][]string{
		"setup":   {"CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapBnd: 0000000000000403", "CapAmb: 0000000000000000", "0", "secret"},
		"plain":   {"CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapBnd: 0000000000000403", "CapAmb: 0000000000000000", "1000", "denied"},
		"granted": {"CapPrm: 0000000000000402", "CapEff: 0000000000000402", "CapBnd: 0000000000000403", "CapAmb: 0000000000000402", "1000", "secret"},
		"root":    {"CapPrm: 0000000000000001", "CapEff: 0000000000000001", "CapBnd: 0000000000000403", "CapAmb: 0000000000000001", "0", "secret"},
	}
	for i, p := range phases {
		if i > 0 {
			if err := sb.SetPhase(ctx, p); err != nil {
				t.Fatal(err)
			}
		} else {
			res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh("echo secret > /secret && chmod 600 /secret")}})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("writing /secret: %v %+v", err, res)
			}
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(probe)}})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want[p.Name] {
			if !strings.Contains(res.Stdout, w+"\n") {
				t.Errorf("phase %s: no %q in\n%s%s", p.Name, w, res.Stdout, res.Stderr)
			}
		}
	}
	// A phase beyond the sandbox's capabilities is refused.
	if err := sb.SetPhase(ctx, api.Phase{Name: "more", Capabilities: []string{"CAP_KILL"}}); errdefs.CodeOf(err) != "capability_not_in_sandbox" {
		t.Errorf("SetPhase beyond the sandbox's capabilities: %v", err)
	}
}

// TestPhaseExecutables: in a phase with allowed executables the allowed
// programs run (through their symlinks too) and any other exec, direct
// or from a shell, is killed before it runs and audited
// (exec-not-allowed); the same execs run in a phase without them (the
// negative control) and again once the sandbox leaves the phase. A node
// without the monitor refuses such phases.
func TestPhaseExecutables(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	mon, rec, log := startMonitor(t)
	rt := newRuntime(t, dir, runtimeOptions{monitor: rec})
	ctx := context.Background()
	phases := []api.Phase{
		{Name: "open"},
		{Name: "locked", Executables: []string{"/bin/busybox"}},
		{Name: "after"},
	}
	if _, err := rt.Create(ctx, sandbox.Spec{ID: "unenforced", Image: world.image(), Phases: phases[1:]}); errdefs.CodeOf(err) != "executables_unenforced" {
		t.Errorf("Create without an enforcer: %v, want executables_unenforced", err)
	}
	rt.opt.Exec = mon // before any sandbox: no one reads it yet
	if _, err := rt.Create(ctx, sandbox.Spec{ID: "badexec", Image: world.image(), Phases: []api.Phase{{Name: "a", Executables: []string{"bin/*"}}}}); errdefs.CodeOf(err) != "invalid_executable" {
		t.Errorf("Create with a relative executable: %v, want invalid_executable", err)
	}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "execphases", Image: world.image(), Phases: phases})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	defer sb.Destroy(ctx)
	run := func(script string) string {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(script)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Stdout // the shell reports "Killed" on stderr
	}
	const attempts = `/tmp/true true; echo "copy $?"; sh -c 'exec /tmp/true true'; echo "via sh $?"; ls / >/dev/null && echo allowed`
	if got := run(`cp /bin/busybox /tmp/true && ` + attempts); got != "copy 0\nvia sh 0\nallowed\n" {
		t.Fatalf("negative control, no executables: %q", got)
	}
	if err := sb.SetPhase(ctx, phases[1]); err != nil {
		t.Fatal(err)
	}
	if got := run(attempts); got != "copy 137\nvia sh 137\nallowed\n" {
		t.Errorf("locked: %q, want the copy killed", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := 0
		log.mu.Lock()
		for _, e := range log.evs {
			if e.Sandbox == sb.id && e.Rule == "exec-not-allowed" && e.Path == "/tmp/true" && e.Verdict == "denied" && e.Phase == "locked" && e.Severity == "high" {
				n++
			}
		}
		log.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d exec-not-allowed audit events for /tmp/true in phase locked, want 2", n)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := sb.SetPhase(ctx, phases[2]); err != nil {
		t.Fatal(err)
	}
	if got := run(attempts); got != "copy 0\nvia sh 0\nallowed\n" {
		t.Errorf("after the locked phase: %q", got)
	}
}
