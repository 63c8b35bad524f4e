package cgroups

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// agentLike starts threadForkRole holding 32 MiB, puts it in g (and, if
// commands, its forking thread in g's commands group), and lets its
// thread run a command that writes 96 MiB to a tmpfs of the test's: the
// pages count against the memory group of the writer, but against no
// process's resident memory, so at the limit the OOM killer's largest
// task is the process holding 32 MiB, unless it is out of reach.
func agentLike(t *testing.T, g *Group, commands bool) *started {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=128m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the test's tmpfs: %v", err)
		}
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{roleEnv + "=threadfork", "HOLD=32", "CMD=exec dd if=/dev/zero of=" + dir + "/fill bs=1M count=96 2>/dev/null"}, self)
	line, err := p.stdout.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	tid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || tid == p.cmd.Process.Pid {
		t.Fatalf("the forking thread is %q (process %d)", line, p.cmd.Process.Pid)
	}
	if err := g.AddProc(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if commands {
		if err := g.AddCommandThread(tid); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(g.memory, g.m.hier["memory"])
		if got := procCgroups(t, p.cmd.Process.Pid)["memory"]; got != rel {
			t.Errorf("the process's leader is in memory group %s, want %s", got, rel)
		}
	}
	p.release(t)
	return p
}

// TestCommandsGroup: with AgentMemoryBytes, the group's memory limit is
// the sum and the commands group gets MemoryBytes; a process shaped like
// the agent has its forking thread moved there, and what that thread
// forks fills the commands group and is the one killed, while the
// process lives on (TestCommandsGroupControl: without the commands
// group, the process is killed).
func TestCommandsGroup(t *testing.T) {
	m := newManager(t, Options{})
	if m.Mode() == V2 {
		t.Skip("no commands group on v2 (AddCommandThread says so: TestCommandsGroupV2)")
	}
	const mem, agent = 48 << 20, 40 << 20
	g, err := m.Create(ctx, "cmds", Limits{MemoryBytes: mem, AgentMemoryBytes: agent})
	if err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]int64{g.memory: mem + agent, g.commands: mem} {
		for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
			if f == "memory.memsw.limit_in_bytes" && !m.memsw {
				continue
			}
			if got := readInt(t, filepath.Join(dir, f)); got != want {
				t.Errorf("%s/%s = %d, want %d", dir, f, got, want)
			}
		}
	}
	p := agentLike(t, g, true)
	line, err := p.stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("the process said nothing more: %v (%v)", err, p.wait(t, 10*time.Second))
	}
	t.Logf("helper: %s", strings.TrimSpace(line))
	if !strings.HasSuffix(strings.TrimSpace(line), "signal: killed") {
		t.Errorf("the command ended with %q, want killed by the OOM killer", line)
	}
	if err := p.wait(t, 30*time.Second); err != nil {
		t.Errorf("the process whose thread forked the command: %v, want it alive and exiting 0", err)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills != 1 {
		t.Errorf("OOMKills = %d, want 1 (the command's, counted in the commands group)", st.OOMKills)
	}
	if got := readInt(t, filepath.Join(g.commands, "memory.max_usage_in_bytes")); got < mem-(4<<20) {
		t.Errorf("the commands group's peak is %d, want near its %d limit", got, mem)
	}
	// The test's tmpfs still holds the command's pages: Recycle keeps no
	// group charged with that much.
	if err := m.Recycle(ctx, g); err != nil {
		t.Fatal(err)
	}

	// A recycled group keeps its commands group, its counters count from
	// zero, and other limits change both limits.
	g1, err := m.Create(ctx, "cmds1", Limits{MemoryBytes: mem, AgentMemoryBytes: agent})
	if err != nil {
		t.Fatal(err)
	}
	memIno := inode(t, g1.memory)
	if err := m.Recycle(ctx, g1); err != nil {
		t.Fatal(err)
	}
	g2, err := m.Create(ctx, "cmds2", Limits{MemoryBytes: 2 * mem, AgentMemoryBytes: agent})
	if err != nil {
		t.Fatal(err)
	}
	if inode(t, g2.memory) != memIno {
		t.Fatalf("Create did not reuse the kept group")
	}
	if got := readInt(t, filepath.Join(g2.commands, "memory.limit_in_bytes")); got != 2*mem {
		t.Errorf("recycled: commands limit %d, want %d", got, 2*mem)
	}
	if got := readInt(t, filepath.Join(g2.memory, "memory.limit_in_bytes")); got != 2*mem+agent {
		t.Errorf("recycled: group limit %d, want %d", got, 2*mem+agent)
	}
	if st, err := g2.Stats(); err != nil || st.OOMKills != 0 {
		t.Errorf("recycled: OOMKills %d (%v), want 0", st.OOMKills, err)
	}
	// Destroy removes the commands group with the group.
	if err := g2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g2.memory); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Destroy: %s: %v", g2.memory, err)
	}

	// A group without AgentMemoryBytes has no commands group.
	g3, err := m.Create(ctx, "plain", Limits{MemoryBytes: mem})
	if err != nil {
		t.Fatal(err)
	}
	if err := g3.AddCommandThread(os.Getpid()); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("AddCommandThread without a commands group: %v, want ErrNotSupported", err)
	}
	if err := g3.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCommandsGroupControl is TestCommandsGroup without the commands
// group, in a group of the same total limit: the command and the
// process share one memory group, and the OOM killer kills the process,
// the task with the most resident memory.
func TestCommandsGroupControl(t *testing.T) {
	m := newManager(t, Options{})
	const mem, agent = 48 << 20, 40 << 20
	g, err := m.Create(ctx, "ctl", Limits{MemoryBytes: mem + agent})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	p := agentLike(t, g, false)
	err = p.wait(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the process ended with %v, want killed by the OOM killer", err)
	}
}

// TestCommandsGroupV2: a v2 manager makes no commands group and says so.
func TestCommandsGroupV2(t *testing.T) {
	m := &Manager{mode: V2, parent: "p", unified: "/nonexistent"}
	g := m.group("x")
	if g.commands != "" {
		t.Errorf("v2 group has a commands group %q", g.commands)
	}
	if err := g.AddCommandThread(42); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("AddCommandThread on v2: %v, want ErrNotSupported", err)
	}
}
