package container

import (
	"strings"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestIdleAgents: with no warm sandbox of an image, a create binds an
// idle agent to it, and the sandbox is the one a cold start makes: its
// name, disk, environment, /proc, privileges and filter; an idle agent
// that died in the pool is not handed out (the create starts cold).
func TestIdleAgents(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	rt := newRuntime(t, dir, runtimeOptions{pool: 2, agents: 2})
	img := world.image()
	first := createIn(t, rt, sandbox.Spec{ID: "first", Image: img}, nil)
	if first.state.Prestarted {
		t.Error("the first sandbox came from an empty pool")
	}
	waitWarm(t, rt, 2)

	spec := sandbox.Spec{ID: "bound", Image: img, DiskMB: 48, MemoryMB: 96, Env: map[string]string{"FOO": "bar"}}
	sb := createIn(t, rt, spec, nil)
	if !sb.state.Prestarted {
		t.Fatal("a create with idle agents ready did not bind one")
	}
	res := run(t, sb, sh(`hostname; cat /etc/hostname; grep -c bound /etc/hosts; echo "$FOO $HOSTNAME"; df -m / | awk 'NR==2 {print $2}'; `+
		`grep -E '^(Seccomp|CapBnd|CapEff):' /proc/self/status; cat /proc/1/comm; echo hi > /workspace/f && cat /workspace/f`)...)
	want := "bound\nbound\n1\nbar bound\n48\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nSeccomp:\t2\ndsec-guest\nhi\n"
	if res.Stdout != want {
		t.Errorf("inside the bound sandbox:\n%s\nwant\n%s", res.Stdout, want)
	}
	// Its writable layer is the host's to mark and snapshot, as a cold
	// sandbox's.
	sb.umu.Lock()
	hasUpper := sb.upper != nil
	sb.umu.Unlock()
	if !hasUpper {
		t.Error("the bound sandbox has no handle on its writable layer")
	}

	// Idle agents that died in the pool are not handed out.
	waitWarm(t, rt, 2)
	for _, s := range idleReady(rt) {
		if err := syscall.Kill(s.state.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	again := createIn(t, rt, sandbox.Spec{ID: "after-kill", Image: img, DiskMB: 40}, nil)
	if got := run(t, again, "hostname").Stdout; strings.TrimSpace(got) != "after-kill" {
		t.Errorf("hostname %q", got)
	}
}

// idleReady returns the idle agents ready in rt's pool.
func idleReady(rt *testRuntime) []*Sandbox {
	p := rt.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*Sandbox
	for _, s := range p.sets {
		if s.idle {
			out = append(out, s.ready...)
		}
	}
	return out
}
