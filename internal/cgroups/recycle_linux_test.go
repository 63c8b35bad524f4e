package cgroups

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

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestRecycle: a recycled group is handed to the next Create with its
// old limits lifted, its counters rebased, thawed, and nothing of its
// first owner running; Close removes what is kept.
func TestRecycle(t *testing.T) {
	m := newManager(t, Options{})
	reapOrphans(t)
	g, err := m.Create(ctx, "first", Limits{Pids: 20, MemoryBytes: 64 << 20, CPU: 0.5, CPUWeight: 512})
	if err != nil {
		t.Fatal(err)
	}
	// The first owner hits its pids limit and uses some CPU.
	sh := start(t, nil, "/bin/sh", "-c", `exec 2>/dev/null; read x; i=0; while [ $i -lt 40 ]; do i=$((i+1)); sleep 60 & done; echo done`)
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sh.release(t)
	_ = sh.wait(t, 10*time.Second)
	before, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if before.PidsLimited < 1 {
		t.Fatalf("the first owner was never refused a fork: %+v", before)
	}
	// And it used 40 MiB at its peak (freed when it exits).
	py := start(t, nil, "/usr/bin/python3", "-c", "import sys; sys.stdin.readline(); b = bytearray(b'x') * (40 << 20)")
	if err := g.AddProc(py.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	py.release(t)
	_ = py.wait(t, 10*time.Second)
	if peak := readInt(t, filepath.Join(g.memory, "memory.max_usage_in_bytes")); peak < 40<<20 {
		t.Fatalf("the first owner's peak is %d bytes, want at least 40 MiB", peak)
	}
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	memIno := inode(t, g.memory)
	if err := m.Recycle(ctx, g); err != nil {
		t.Fatal(err)
	}
	// Kept under another name: the sandbox's groups are gone by name.
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is left after Recycle", d)
		}
	}
	if kept := m.Kept(); len(kept) != 1 || !strings.HasPrefix(kept[0], keepPrefix) {
		t.Fatalf("kept %v", kept)
	}

	g2, err := m.Create(ctx, "second", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// The same v1 directory, renamed; a new cgroup2 one (a new id).
	if g2.Name() != "second" || inode(t, g2.memory) != memIno || g2.ID() == g.ID() || len(m.Kept()) != 0 {
		t.Fatalf("Create made %q (memory inode %d, was %d; id %d, was %d), want the kept group", g2.Name(), inode(t, g2.memory), memIno, g2.ID(), g.ID())
	}
	want := map[string]string{
		filepath.Join(g2.pids, "pids.max"):                "512",
		filepath.Join(g2.memory, "memory.limit_in_bytes"): strconv.FormatInt(readInt(t, filepath.Join(filepath.Dir(g2.memory), "memory.limit_in_bytes")), 10),
		filepath.Join(g2.cpu, "cpu.cfs_quota_us"):         "-1",
		filepath.Join(g2.cpu, "cpu.shares"):               "1024",
		filepath.Join(g2.unified, "cgroup.freeze"):        "0",
	}
	for p, v := range want {
		if got := readTrim(t, p); got != v {
			t.Errorf("%s = %s, want %s", p, got, v)
		}
	}
	// The high-water mark starts again from what the group holds now.
	if peak := readInt(t, filepath.Join(g2.memory, "memory.max_usage_in_bytes")); peak >= 20<<20 {
		t.Errorf("the second owner's memory peak is %d bytes: the first owner's (≥ 40 MiB) carried over", peak)
	}
	st, err := g2.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.PidsLimited != 0 || st.Pids != 0 || st.Frozen || st.CPUSeconds > 0.001 {
		t.Errorf("the second owner sees the first's counters: %+v (first: %+v)", st, before)
	}
	// Its own refusals count from zero.
	if err := m.Recycle(ctx, g2); err != nil {
		t.Fatal(err)
	}
	g3, err := m.Create(ctx, "third", Limits{Pids: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(g3.pids, "pids.max")); got != "5" {
		t.Errorf("pids.max = %s, want 5", got)
	}
	sh = start(t, nil, "/bin/sh", "-c", `exec 2>/dev/null; read x; i=0; while [ $i -lt 10 ]; do i=$((i+1)); sleep 60 & done; echo done`)
	if err := g3.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sh.release(t)
	_ = sh.wait(t, 10*time.Second)
	// dash gives up at its first refused fork: each owner is refused
	// once; counted from the group's creation, the third would see two.
	if st, _ := g3.Stats(); st.PidsLimited != 1 || before.PidsLimited != 1 {
		t.Errorf("third owner: %d refusals, first owner %d; want 1 each", st.PidsLimited, before.PidsLimited)
	}
	if err := m.Recycle(ctx, g3); err != nil {
		t.Fatal(err)
	}
	// Close removes the kept group (g4, in use, stays, and so does the
	// parent); Recycle removes from then on, and Create fails.
	g4, err := m.Create(ctx, "fourth", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if names, _ := m.List(); len(names) != 1 || names[0] != "fourth" {
		t.Errorf("after Close: %v, want [fourth]", names)
	}
	if err := m.Recycle(ctx, g4); err != nil {
		t.Fatal(err)
	}
	if names, _ := m.List(); len(names) != 0 {
		t.Errorf("Recycle after Close kept %v", names)
	}
	if _, err := m.Create(ctx, "fifth", Limits{}); !errors.Is(err, errdefs.Unavailable) {
		t.Errorf("Create after Close: %v, want errdefs.Unavailable", err)
	}
}

// TestRecycleRefusesStray: a group with a task Kill did not reach (one
// moved into a v1 hierarchy only) is removed, not handed on with it.
func TestRecycleRefusesStray(t *testing.T) {
	m := newManager(t, Options{})
	if m.Mode() != Hybrid {
		t.Skipf("needs a hybrid host (this one is %v)", m.Mode())
	}
	g, err := m.Create(ctx, "stray", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sh := start(t, nil, "/bin/sh", "-c", "read x")
	if err := writeFile(filepath.Join(g.pids, "cgroup.procs"), strconv.Itoa(sh.cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	if err := m.Recycle(ctx, g); err != nil {
		t.Fatal(err)
	}
	if names, _ := m.List(); len(names) != 0 {
		t.Errorf("a group with a stray task was kept: %v", names)
	}
	// The control: the same group without the stray is kept.
	g, err = m.Create(ctx, "clean", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Recycle(ctx, g); err != nil {
		t.Fatal(err)
	}
	if names, _ := m.List(); len(names) != 1 || len(m.Kept()) != 1 {
		t.Errorf("a clean group was not kept: %v", names)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(readTrim(t, path), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// reapOrphans makes the test process the reaper of its descendants'
// orphans and reaps the zombie sleeps among its children until the test
// ends: the sleeps a test shell leaves behind would otherwise stay
// zombies (this host's init does not reap them), holding pids in their
// group. Its own children (os/exec's to wait for) are left alone.
func reapOrphans(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			tasks, _ := filepath.Glob("/proc/self/task/*/children")
			for _, f := range tasks {
				b, _ := os.ReadFile(f)
				for _, p := range strings.Fields(string(b)) {
					pid, _ := strconv.Atoi(p)
					stat, _ := os.ReadFile("/proc/" + p + "/stat")
					if _, own := startedPids.Load(pid); !own && strings.Contains(string(stat), ") Z ") {
						var ws unix.WaitStatus
						_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
					}
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(done)
		// bounded: the reaper goroutine stops as soon as done is closed
		<-stopped
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	})
}

// TestCloseRemovesParent: a Manager closed with no group below its parent
// leaves no directory of its own in any hierarchy; one closed with a group
// in use (a sandbox kept across a restart) keeps the parent for it, and a
// later Manager's Close, once that group is gone, removes it.
func TestCloseRemovesParent(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoParent(t, m.parent)

	m = newManager(t, Options{})
	g, err := m.Create(ctx, "kept", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range m.hierDirs(m.parent) {
		if _, err := os.Stat(filepath.Join(d, "kept")); err != nil {
			t.Errorf("Close removed a group in use or its parent: %v", err)
		}
	}
	m2, err := New(ctx, Options{Parent: m.parent})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := m2.Open(g.name)
	if err != nil {
		t.Fatal(err)
	}
	if err := g2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoParent(t, m.parent)
}
