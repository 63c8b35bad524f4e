package container

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
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

// warnCounter counts the warnings logged through it.
type warnCounter struct {
	mu   sync.Mutex
	msgs []string
}

func (c *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *warnCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.msgs = append(c.msgs, r.Message)
	c.mu.Unlock()
	return nil
}
func (c *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *warnCounter) WithGroup(string) slog.Handler      { return c }

func (c *warnCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// TestWarmPoolImageWithoutAgent: creates of an image that lacks the
// agent fail with image_lacks_guest, and the warm pool tries to start
// sandboxes of it once, warning once, instead of at every create.
func TestWarmPoolImageWithoutAgent(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	rt := newRuntime(t, dir, runtimeOptions{pool: 2, warm: 2})
	warns := &warnCounter{}
	rt.log = slog.New(warns) // before any create: nothing reads it yet
	ctx := context.Background()
	img := sandbox.Image{ID: "bare", Name: "bare", Layers: world.bare}
	for i := range 4 {
		_, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("bare-%d", i), Image: img})
		if errdefs.CodeOf(err) != "image_lacks_guest" {
			t.Fatalf("create %d: %v, want image_lacks_guest", i, err)
		}
		// Let the fills the create started finish.
		deadline := time.Now().Add(20 * time.Second)
		for {
			rt.warm.mu.Lock()
			filling := 0
			for _, s := range rt.warm.sets {
				filling += s.filling
			}
			rt.warm.mu.Unlock()
			if filling == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("warm fills still running 20 s after create %d", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := warns.count(); n != 1 {
		t.Errorf("%d warnings for 4 creates of an image without the agent, want 1: %q", n, warns.msgs)
	}
}

// TestWarmClaimNeedsAnAnswer: a warm sandbox whose agent no longer
// answers (stopped here; under load, gone or stuck) is not handed out:
// the create starts a sandbox of its own, whose first command runs.
func TestWarmClaimNeedsAnAnswer(t *testing.T) {
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
	waitWarm(t, rt, 1)
	rt.warm.mu.Lock()
	var pid int
	for _, s := range rt.warm.sets {
		for _, sb := range s.ready {
			pid = sb.state.Pid
		}
	}
	rt.warm.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "fresh", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	if sb.state.Pid == pid || sb.state.Prestarted {
		t.Errorf("the create claimed the warm sandbox whose agent was stopped (pid %d)", pid)
	}
	ectx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if res, err := sb.Exec(ectx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}); err != nil || res.ExitCode != 0 {
		t.Errorf("the first command of the created sandbox: %+v, %v", res, err)
	}
	for _, s := range []sandbox.Sandbox{cold, created} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
