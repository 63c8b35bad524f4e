package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// waitWarm waits until the runtime has n warm sandboxes ready.
func waitWarm(t *testing.T, rt *testRuntime, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for rt.WarmReady() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d warm sandboxes ready after 20 s, want %d", rt.WarmReady(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWarmPool: a create after the first of an image claims a warm
// sandbox, which then is the requested one in every way a command, the
// host or a restart can see; one with a network policy never does.
func TestWarmPool(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	rt := newRuntime(t, dir, runtimeOptions{pool: 2, warm: 1})
	ctx := context.Background()
	img := world.image()
	cold, err := rt.Create(ctx, sandbox.Spec{ID: "cold", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if cold.(*Sandbox).state.Prestarted {
		t.Error("the image's first sandbox was prestarted")
	}
	waitWarm(t, rt, 1)

	spec := sandbox.Spec{ID: "claimed", Image: img, MemoryMB: 96, CPU: 0.5, Env: map[string]string{"FOO": "bar"}}
	claimed, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	sb := claimed.(*Sandbox)
	if !sb.state.Prestarted {
		t.Fatal("a create with a warm sandbox ready did not claim it")
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		Cmd: sh(`hostname; cat /etc/hostname; grep -c claimed /etc/hosts; echo "$FOO $HOSTNAME $BAR"; grep -c warm- /etc/hosts /etc/hostname || true`),
		Env: map[string]string{"BAR": "baz"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "claimed\nclaimed\n1\nbar claimed baz\n/etc/hosts:0\n/etc/hostname:0\n"
	if res.Stdout != want || res.ExitCode != 0 {
		t.Errorf("inside the claimed sandbox: %q (exit %d, %s), want %q", res.Stdout, res.ExitCode, res.Stderr, want)
	}
	// The host sees it under its ID: directory, cgroups with its limits,
	// its agent in them; nothing of the warm sandbox's name is left.
	if _, err := os.Stat(filepath.Join(dir, "sandboxes", "claimed", stateName)); err != nil {
		t.Error(err)
	}
	for _, d := range sb.cg.Dirs() {
		if filepath.Base(d) != "claimed" {
			t.Errorf("cgroup %s", d)
		}
	}
	// Its commands get the memory asked for, its agent a share beside
	// them (cgroups.CommandsGroup).
	mem := filepath.Join("/sys/fs/cgroup/memory", nm.CgroupParent, "claimed")
	if got := strings.TrimSpace(readFile(t, filepath.Join(mem, "commands", "memory.limit_in_bytes"))); got != fmt.Sprint(96<<20) {
		t.Errorf("commands' memory limit %s, want 96 MiB", got)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(mem, "memory.limit_in_bytes"))); got != fmt.Sprint(96<<20+agentMemoryBytes) {
		t.Errorf("memory limit %s, want 96 MiB and the agent's %d", got, agentMemoryBytes)
	}
	if procs, err := sb.cg.Procs(); err != nil || len(procs) == 0 || procs[0] != sb.state.Pid {
		t.Errorf("cgroup processes %v (%v), want the agent %d", procs, err, sb.state.Pid)
	}
	if st, err := sb.Stats(ctx); err != nil || st.MemoryLimitBytes != 96<<20 {
		t.Errorf("stats %+v, %v", st, err)
	}
	// A policy with a network is never warm.
	netSpec := sandbox.Spec{ID: "linked", Image: img, Network: &api.NetworkPolicy{Egress: api.EgressOpen}}
	linked, err := rt.Create(ctx, netSpec)
	if err != nil {
		t.Fatal(err)
	}
	if linked.(*Sandbox).state.Prestarted {
		t.Error("a sandbox with a network of the node's was prestarted")
	}
	for _, s := range []sandbox.Sandbox{cold, claimed, linked} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A warm sandbox a crash leaves behind is destroyed by the next
	// start, not adopted.
	waitWarm(t, rt, 1)
	rt.warm = nil // the crash: Close leaves the warm sandbox running
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), "warm-") {
		t.Fatalf("before the restart: %v, want one warm sandbox", ents)
	}
	rt = newRuntime(t, dir, runtimeOptions{pool: 2, warm: 1})
	sbs, err := rt.Recover(ctx)
	if err != nil || len(sbs) != 0 {
		t.Fatalf("Recover adopted %d sandboxes (%v), want none", len(sbs), err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
