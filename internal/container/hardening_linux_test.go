package container

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestCommandsHoldNoCapabilities checks that a command run as the
// sandbox's root has no capabilities at all, no_new_privs and the seccomp
// filter, however many commands the agent has forked and from however
// many goroutines, and that the negative control (the same probe with no
// filter configured) differs where it should.
func TestCommandsHoldNoCapabilities(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	sb, err := rt.Create(ctx, sandbox.Spec{ID: "caps", Image: world.image()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	status := func() string {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"cat", "/proc/self/status"}}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("reading status: %v %+v", err, res)
		}
		return res.Stdout
	}
	// Concurrent commands: forks come from several agent goroutines.
	done := make(chan string, 8)
	for range 8 {
		go func() { done <- status() }()
	}
	for range 8 {
		st := testenv.Recv(t, done, time.Minute, "a concurrent status read")
		for _, want := range []string{
			"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
			"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2",
		} {
			if !strings.Contains(st, want+"\n") {
				t.Errorf("a command's status lacks %q:\n%s", want, st)
			}
		}
	}
	// The agent itself (PID 1) holds capabilities: the probe can tell.
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"grep", "CapEff", "/proc/1/status"}}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, "0000000000000000") || res.ExitCode != 0 {
		t.Errorf("PID 1's effective set reads %q: the probe cannot see a difference", res.Stdout)
	}
}

// TestLimitsReported checks that hitting the memory and disk limits
// affects only the offending command and shows in the sandbox's stats,
// which read zero before (so the check can fail).
func TestLimitsReported(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	sb, err := rt.Create(ctx, sandbox.Spec{ID: "limits", Image: world.image(), MemoryMB: 64, DiskMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	run := func(cmd ...string) api.ExecResult {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: cmd, TimeoutS: 60}})
		if err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
		return res
	}
	before, err := sb.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.OOMKills != 0 || before.DiskFull || before.MemoryLimitBytes != 64<<20 || before.DiskLimitBytes < 15<<20 {
		t.Fatalf("stats before any limit was hit: %+v", before)
	}
	if res := run(busyboxCommands.AllocMB(256)...); res.ExitCode == 0 {
		t.Errorf("allocating 256 MiB under a 64 MiB limit succeeded: %+v", res)
	}
	res := run("sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=64 2>&1; echo rc=$?")
	if !strings.Contains(res.Stdout, "No space left on device") {
		t.Errorf("filling a 16 MiB disk with 64 MiB: %q", res.Stdout)
	}
	after, err := sb.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.OOMKills < 1 || !after.DiskFull || after.DiskBytes < 15<<20 {
		t.Errorf("stats after hitting the limits: %+v (want oom_kills ≥ 1, disk_full, disk_bytes ≈ 16 MiB)", after)
	}
	// Only the offending commands died.
	if res := run("echo", "alive"); res.Stdout != "alive\n" {
		t.Errorf("the sandbox after its limits were hit: %+v", res)
	}
	if res := run("rm", "/fill"); res.ExitCode != 0 {
		t.Errorf("rm: %+v", res)
	}
	if st, _ := sb.Stats(ctx); st.DiskFull {
		t.Errorf("disk still full after rm: %+v", st)
	}
}

// TestAgentUnpinned checks that a sandbox started on one CPU by the
// zygote (guest.zygoteStart) lets its agent's threads and its commands
// run on every CPU the node may use once set up.
func TestAgentUnpinned(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	want := statusField(t, "/proc/self/status", "Cpus_allowed_list")
	// Several sandboxes: the zygote pins each to the next CPU in turn.
	for i := range 3 {
		sb, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("cpus-%d", i), Image: world.image()})
		if err != nil {
			t.Fatal(err)
		}
		pid := sb.(*Sandbox).state.Pid
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil || len(tasks) < 2 {
			t.Fatalf("the agent's threads: %v (%d)", err, len(tasks))
		}
		for _, task := range tasks {
			got := statusField(t, fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()), "Cpus_allowed_list")
			if got != want {
				t.Errorf("agent thread %s may run on CPUs %q, the node on %q", task.Name(), got, want)
			}
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"grep", "Cpus_allowed_list", "/proc/self/status"}}})
		if err != nil || !strings.Contains(res.Stdout, "\t"+want+"\n") {
			t.Errorf("a command's CPUs: %v %+v, want %q", err, res, want)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// statusField is key's value in a /proc status file.
func statusField(t *testing.T, path, key string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in %s", key, path)
	return ""
}
