//go:build linux

package cgroups

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestV1Path runs the v1 code on this hybrid host's v1 hierarchies, with
// the unified tree ignored: the v1 freezer, cpuacct, and Kill by freeze +
// pidfd SIGKILL + thaw.
func TestV1Path(t *testing.T) {
	m := newManager(t, Options{Mode: V1})
	if m.Mode() != V1 {
		t.Fatalf("mode %v", m.Mode())
	}
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer"} {
		if m.hier[c] == "" {
			t.Fatalf("no %s hierarchy", c)
		}
	}
	g, err := m.Create(ctx, "v1", Limits{MemoryBytes: 128 << 20, Pids: 200, CPU: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	if g.ID() != 0 || g.Path2() != "" {
		t.Errorf("a v1 group has cgroup2 id %d, path %q", g.ID(), g.Path2())
	}
	if got := readTrim(t, filepath.Join(g.freezer, "freezer.state")); got != "THAWED" {
		t.Errorf("freezer.state = %s", got)
	}
	t.Run("freeze", func(t *testing.T) { testFreezeThaw(t, g) })

	sh := start(t, nil, "/bin/sh", "-c", `read x; for i in $(seq 50); do sleep 600 & done; while :; do :; done`)
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	cg := procCgroups(t, sh.cmd.Process.Pid)
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "devices"} {
		if cg[c] != "/"+m.parent+"/v1" {
			t.Errorf("/proc/%d/cgroup %s: %q", sh.cmd.Process.Pid, c, cg[c])
		}
	}
	sh.release(t)
	waitFor(t, 10e9, "the shell's 50 sleeps", func() bool {
		p, _ := g.Procs()
		return len(p) >= 51
	})
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs() {
		if p, _ := readProcs(d); len(p) != 0 {
			t.Errorf("%s lists %v after Kill", d, p)
		}
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUSeconds <= 0 || st.Frozen {
		t.Errorf("stats after the busy loop: %+v", st)
	}
	if err := g.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHybridStrayV1Process: a process in the group's v1 hierarchies but not
// in its cgroup2 group (someone moved it there) escapes cgroup.kill; Kill
// finds and kills it through the v1 member list.
func TestHybridStrayV1Process(t *testing.T) {
	m := newManager(t, Options{})
	if m.Mode() != Hybrid {
		t.Skip("hybrid host only")
	}
	g, err := m.Create(ctx, "stray", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, "sleep", "600")
	if err := writeFile(filepath.Join(g.memory, "cgroup.procs"), strconv.Itoa(p.cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	if err := g.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t, 5e9); err == nil {
		t.Error("the stray process was not killed")
	}
}

// TestV2PathReal runs the v2 code for real on a cgroup2 file system
// mounted in a temporary directory. cgroup2 is one hierarchy per cgroup
// namespace, so the new mount shows this host's unified tree, which has
// no controllers: what is tested is detection, groups, membership, the
// cgroup2 id, freeze/thaw, cgroup.kill and removal, and that a limit
// needing a missing controller fails instead of being skipped.
func TestV2PathReal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroup tests need root")
	}
	root := filepath.Join(t.TempDir(), "cg2")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("none", root, "cgroup2", 0, ""); err != nil {
		t.Skipf("mounting cgroup2: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting: %v", err)
		}
	})
	m := newManager(t, Options{Root: root})
	if m.Mode() != V2 {
		t.Fatalf("mode %v on a cgroup2 root", m.Mode())
	}
	if _, err := m.Create(ctx, "nopids", Limits{}); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("Create with the default pids limit and no pids controller = %v, want ErrNotSupported", err)
	}
	if _, err := m.Create(ctx, "nomem", Limits{Pids: -1, MemoryBytes: 1 << 30}); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("Create with a memory limit and no memory controller = %v, want ErrNotSupported", err)
	}
	if ids, _ := m.List(); len(ids) != 0 {
		t.Errorf("failed Creates left %v", ids)
	}
	g, err := m.Create(ctx, "v2", Limits{Pids: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	if !slices.Equal(g.Dirs(), []string{filepath.Join(root, m.parent, "v2")}) {
		t.Errorf("dirs %v", g.Dirs())
	}
	fi, err := os.Stat(g.Path2())
	if err != nil {
		t.Fatal(err)
	}
	if g.ID() != fi.Sys().(*syscall.Stat_t).Ino {
		t.Errorf("ID %d, inode %d", g.ID(), fi.Sys().(*syscall.Stat_t).Ino)
	}
	t.Run("freeze", func(t *testing.T) { testFreezeThaw(t, g) })
	sh := start(t, nil, "/bin/sh", "-c", `read x; for i in $(seq 20); do sleep 600 & done; wait`)
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if cg := procCgroups(t, sh.cmd.Process.Pid); cg[""] != "/"+m.parent+"/v2" {
		t.Errorf("/proc/%d/cgroup: %v", sh.cmd.Process.Pid, cg)
	}
	sh.release(t)
	waitFor(t, 10e9, "21 processes", func() bool {
		p, _ := g.Procs()
		return len(p) >= 21
	})
	// Only cgroup.kill can do this: a v2 group has no v1 fallback.
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := g.Procs(); len(p) != 0 {
		t.Errorf("after cgroup.kill: %v", p)
	}
	if err := g.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestV2Files checks the v2 controller files logic (limits written,
// controllers enabled, stats parsed) on a temporary directory laid out
// like a cgroup2 group: this host has no cgroup2 controllers to test it
// on. The real-kernel part of the v2 path is TestV2PathReal.
func TestV2Files(t *testing.T) {
	root := t.TempDir()
	m := &Manager{mode: V2, parent: "dsec", unified: root, log: slog.New(slog.DiscardHandler),
		v2ctl: map[string]bool{"cpu": true, "memory": true, "pids": true}, v2swap: true, v2peak: true}
	dir := filepath.Join(root, "dsec", "sb")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"cgroup.subtree_control": "", "memory.max": "max", "memory.swap.max": "max", "memory.oom.group": "0",
		"pids.max": "max", "cpu.max": "max 100000", "cpu.weight": "100",
		"memory.current": "123456\n", "memory.peak": "654321\n",
		"memory.events": "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 1\n",
		"pids.current":  "9\n", "pids.events": "max 4\n",
		"cpu.stat":      "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		"cgroup.events": "populated 1\nfrozen 1\n",
	}
	for _, d := range []string{root, filepath.Join(root, "dsec"), dir} {
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(d, f), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := m.enableV2Controllers(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{root, filepath.Join(root, "dsec")} {
		if got := readTrim(t, filepath.Join(d, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control = %q", d, got)
		}
	}
	g := m.group("sb")
	if g.unified != dir || g.memory != "" {
		t.Fatalf("group dirs: %+v", g)
	}
	if err := g.apply(Limits{CPU: 0.5, MemoryBytes: 1 << 30, Pids: 64, CPUWeight: 1024}); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{
		"memory.max": "1073741824", "memory.swap.max": "0", "memory.oom.group": "1",
		"pids.max": "64", "cpu.max": "50000 100000", "cpu.weight": "39",
	} {
		if got := readTrim(t, filepath.Join(dir, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{MemoryBytes: 123456, MemoryPeak: 654321, CPUSeconds: 2.5, Pids: 9, PidsLimited: 4, OOMKills: 2, Frozen: true}
	if st != want {
		t.Errorf("Stats = %+v\nwant    %+v", st, want)
	}
	for _, tc := range []struct {
		shares, weight int
	}{{2, 1}, {1024, 39}, {262144, 10000}} {
		if got := sharesToWeight(tc.shares); got != tc.weight {
			t.Errorf("sharesToWeight(%d) = %d, want %d", tc.shares, got, tc.weight)
		}
	}
}
