package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestRecoverRemovesBrokenSandboxes leaves sandboxes in the states a
// crash of the node service can leave them in (or that a sandbox can get
// into while no agent watches), restarts the runtime and checks that
// Recover re-adopts the intact one and removes every trace of the others:
// processes, cgroups, network namespaces and records, veths, nftables
// elements, mounts and directories.
func TestRecoverRemovesBrokenSandboxes(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	ctx := context.Background()
	breaks := []struct {
		name string
		do   func(t *testing.T, id string, st *state)
	}{
		// A crash between the agent's start and the state's write (or
		// during the write).
		{"state-lost", func(t *testing.T, id string, st *state) {
			sbDir := filepath.Join(dir, "sandboxes", id)
			must(t, os.Rename(filepath.Join(sbDir, stateName), filepath.Join(sbDir, stateName+".tmp")))
		}},
		{"state-torn", func(t *testing.T, id string, st *state) {
			must(t, os.WriteFile(filepath.Join(dir, "sandboxes", id, stateName), []byte(`{"spec":{"id":`), 0o600))
		}},
		// The agent died (the kernel then kills the sandbox's every
		// process: it is PID 1 of their namespace).
		{"agent-dead", func(t *testing.T, id string, st *state) {
			must(t, syscall.Kill(st.Pid, syscall.SIGKILL))
			for alive(st.Pid) && !isZombie(st.Pid) {
				time.Sleep(time.Millisecond)
			}
		}},
		// The network's record is lost (a crash inside Acquire): the
		// network manager removes the namespace, and the sandbox cannot
		// be adopted without it.
		{"network-lost", func(t *testing.T, id string, st *state) {
			must(t, os.Remove(filepath.Join(dir, "netstate", nm.Net, id+".json")))
		}},
	}

	rt := newRuntime(t, dir, runtimeOptions{pool: 2})
	create := func(id string, p *api.NetworkPolicy) sandbox.Sandbox {
		sb, err := rt.Create(ctx, sandbox.Spec{ID: id, Image: w.image(), Network: p})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	create("intact", soakPolicies[1])
	intact, err := testenv.NftElements(nm.Net)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range breaks {
		p := soakPolicies[i%len(soakPolicies)]
		if b.name == "network-lost" && p == nil {
			p = soakPolicies[1] // it needs a network of the node's
		}
		create(b.name, p)
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range breaks {
		st, err := readState(filepath.Join(dir, "sandboxes", b.name))
		if err != nil {
			t.Fatal(err)
		}
		b.do(t, b.name, st)
	}

	rt = newRuntime(t, dir, runtimeOptions{pool: 2})
	sbs, err := rt.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The node service collects the layer cache after Recover (roots of
	// sandboxes without a state are the cache's to unmount).
	if err := rt.layers.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 1 || sbs[0].ID() != "intact" {
		t.Fatalf("Recover adopted %d sandboxes, want only the intact one", len(sbs))
	}
	res, err := sbs[0].Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo", "adopted"}}})
	if err != nil || res.Stdout != "adopted\n" {
		t.Errorf("exec in the adopted sandbox: %+v, %v", res, err)
	}
	for _, b := range breaks {
		if left := sandboxLeftovers(t, dir, nm, b.name); len(left) > 0 {
			t.Errorf("%s: left on the host after Recover: %q", b.name, left)
		}
	}
	// Of the broken sandboxes' nftables elements none is left: the sets
	// hold what they held with the intact sandbox alone (anti-spoofing
	// elements aside: one per namespace, pooled ones included).
	after, err := testenv.NftElements(nm.Net)
	if err != nil {
		t.Fatal(err)
	}
	for set, n := range after {
		if set != "spoof" && n != intact[set] {
			t.Errorf("set %s: %d elements after Recover, want %d (the intact sandbox's)", set, n, intact[set])
		}
	}
	if err := sbs[0].Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	checkIdle(t, rt, dir, 2)
}

// TestRecoverUnresponsiveAgents checks that agents that do not answer
// (here: their sandboxes frozen) neither hold up Recover beyond one
// adoption timeout, however many there are, nor survive it: their
// sandboxes are removed and the others adopted.
func TestRecoverUnresponsiveAgents(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	prev := adoptTimeout
	adoptTimeout = 2 * time.Second
	t.Cleanup(func() { adoptTimeout = prev })
	ctx := context.Background()
	rt := newRuntime(t, dir, runtimeOptions{pool: 2})
	ids := []string{"frozen-0", "ok", "frozen-1", "frozen-2"}
	for _, id := range ids {
		if _, err := rt.Create(ctx, sandbox.Spec{ID: id, Image: w.image()}); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(id, "frozen") {
			cg, err := rt.opt.Cgroups.Open(id)
			if err != nil {
				t.Fatal(err)
			}
			if err := cg.Freeze(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rt = newRuntime(t, dir, runtimeOptions{pool: 2})
	start := time.Now()
	sbs, err := rt.Recover(ctx)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 1 || sbs[0].ID() != "ok" {
		t.Fatalf("Recover adopted %d sandboxes, want only the responsive one", len(sbs))
	}
	if took > 2*adoptTimeout {
		t.Errorf("Recover took %v with 3 unresponsive agents, want about one adoption timeout (%v)", took, adoptTimeout)
	}
	for _, id := range []string{"frozen-0", "frozen-1", "frozen-2"} {
		if left := sandboxLeftovers(t, dir, nm, id); len(left) > 0 {
			t.Errorf("%s: left on the host after Recover: %q", id, left)
		}
	}
	if err := sbs[0].Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// sandboxLeftovers lists what of sandbox id is on the host.
func sandboxLeftovers(t *testing.T, dir string, nm testenv.Sandboxes, id string) []string {
	var out []string
	for _, l := range testenv.HostLeftovers(nm) {
		if strings.HasSuffix(l, "/"+id) || strings.HasSuffix(l, " "+nm.Net+"-"+id) {
			out = append(out, l)
		}
	}
	for _, m := range testenv.Mounts(t, dir) {
		if strings.Contains(m, "/"+id+"/") || strings.HasSuffix(m, "/"+id) {
			out = append(out, "mount "+m)
		}
	}
	for _, p := range []string{filepath.Join(dir, "sandboxes", id), filepath.Join(dir, "netstate", nm.Net, id+".json")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			out = append(out, "file "+p)
		}
	}
	return out
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err == nil && zombie(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRecoverCancelled checks that a Recover whose context ends (the node
// stops while it starts) leaves the sandboxes as they are, for the next
// start to adopt, instead of removing those it had no time for.
func TestRecoverCancelled(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	ctx := context.Background()
	rt := newRuntime(t, dir, runtimeOptions{pool: 1})
	if _, err := rt.Create(ctx, sandbox.Spec{ID: "kept", Image: w.image()}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rt = newRuntime(t, dir, runtimeOptions{pool: 1})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if sbs, err := rt.Recover(cancelled); !errors.Is(err, context.Canceled) || len(sbs) != 0 {
		t.Fatalf("Recover with a cancelled context = %d sandboxes, %v; want none and context.Canceled", len(sbs), err)
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rt = newRuntime(t, dir, runtimeOptions{pool: 1})
	sbs, err := rt.Recover(ctx)
	if err != nil || len(sbs) != 1 {
		t.Fatalf("Recover after a cancelled one = %d sandboxes, %v; want the one", len(sbs), err)
	}
	res, err := sbs[0].Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo", "kept"}}})
	if err != nil || res.Stdout != "kept\n" {
		t.Errorf("exec in the sandbox: %+v, %v", res, err)
	}
	if err := sbs[0].Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}
