//go:build linux

package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

var ctx = context.Background()

func TestDetectHybrid(t *testing.T) {
	m := newManager(t, Options{})
	if m.Mode() != Hybrid {
		t.Skipf("these tests are written for the hybrid development host; layout is %v", m.Mode())
	}
	for _, c := range []string{"cpu", "memory", "pids", "devices"} {
		if m.hier[c] != filepath.Join(hostRoot, c) {
			t.Errorf("hierarchy %s at %q", c, m.hier[c])
		}
	}
	if m.unified != filepath.Join(hostRoot, "unified") {
		t.Errorf("unified at %q", m.unified)
	}
	if _, ok := m.hier["freezer"]; ok {
		t.Error("hybrid mode uses the cgroup2 freezer, not v1's")
	}
}

func TestLimitsApplied(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "limits", Limits{CPU: 1.5, MemoryBytes: 64 << 20, Pids: 100, CPUWeight: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	want := map[string]string{
		filepath.Join(g.memory, "memory.limit_in_bytes"): "67108864",
		filepath.Join(g.pids, "pids.max"):                "100",
		filepath.Join(g.cpu, "cpu.cfs_quota_us"):         "150000",
		filepath.Join(g.cpu, "cpu.cfs_period_us"):        "100000",
		filepath.Join(g.cpu, "cpu.shares"):               "512",
	}
	if m.memsw {
		want[filepath.Join(g.memory, "memory.memsw.limit_in_bytes")] = "67108864"
	}
	for path, v := range want {
		if got := readTrim(t, path); got != v {
			t.Errorf("%s = %q, want %q", path, got, v)
		}
	}
	if oc := readTrim(t, filepath.Join(g.memory, "memory.oom_control")); !strings.Contains(oc, "oom_kill_disable 0") {
		t.Errorf("memory.oom_control:\n%s", oc)
	}
	if dev := m.hier["devices"]; dev != "" {
		got := readTrim(t, filepath.Join(dev, m.parent, g.Name(), "devices.list"))
		if got == "a *:* rwm" || !strings.Contains(got, "c 1:3 rwm") || strings.Contains(got, "c 10:") {
			t.Errorf("devices.list is not the default allow list:\n%s", got)
		}
	}
	if v := readTrim(t, filepath.Join(g.memory, "notify_on_release")); v != "0" {
		t.Errorf("notify_on_release = %s (a release_agent would run on the host)", v)
	}

	d, err := m.Create(ctx, "defaults", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Destroy(ctx)
	for path, v := range map[string]string{
		filepath.Join(d.pids, "pids.max"):                "512",
		filepath.Join(d.cpu, "cpu.cfs_quota_us"):         "-1",
		filepath.Join(d.memory, "memory.limit_in_bytes"): "9223372036854771712",
	} {
		if got := readTrim(t, path); got != v {
			t.Errorf("%s = %q, want %q", path, got, v)
		}
	}
	u, err := m.Create(ctx, "unlimited", Limits{Pids: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Destroy(ctx)
	if got := readTrim(t, filepath.Join(u.pids, "pids.max")); got != "max" {
		t.Errorf("pids.max = %q with Pids -1", got)
	}
}

func TestCreateErrors(t *testing.T) {
	m := newManager(t, Options{})
	for _, id := range []string{"", ".hidden", "a/b", "..", strings.Repeat("x", 200)} {
		if _, err := m.Create(ctx, id, Limits{}); errdefs.ClassOf(err) != errdefs.Invalid {
			t.Errorf("Create(%q) = %v, want invalid", id, err)
		}
	}
	g, err := m.Create(ctx, "dup", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	if _, err := m.Create(ctx, "dup", Limits{}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second Create = %v, want fs.ErrExist", err)
	}
	if _, err := m.Create(ctx, "bad", Limits{CPU: -1}); errdefs.ClassOf(err) != errdefs.Invalid {
		t.Errorf("Create with CPU -1 = %v", err)
	}
	if _, err := m.Open("bad"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed Create left a group behind: Open = %v", err)
	}
	for _, pid := range []int{0, -1} {
		if err := g.AddProc(pid); errdefs.ClassOf(err) != errdefs.Invalid {
			t.Errorf("AddProc(%d) = %v", pid, err)
		}
	}
	if _, err := m.Open("missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(missing) = %v", err)
	}
}

func TestAddProcEveryHierarchy(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "member", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	p := start(t, nil, "sleep", "60")
	if err := g.AddProc(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	want := "/" + m.parent + "/member"
	cg := procCgroups(t, p.cmd.Process.Pid)
	for _, mnt := range m.mounts() {
		key := ""
		if mnt != m.unified {
			key = filepath.Base(mnt) // cpu, memory, pids, devices
		}
		if cg[key] != want {
			t.Errorf("/proc/%d/cgroup: %q is %q, want %q", p.cmd.Process.Pid, key, cg[key], want)
		}
	}
	if pids, err := g.Procs(); err != nil || !slices.Equal(pids, []int{p.cmd.Process.Pid}) {
		t.Errorf("Procs = %v, %v", pids, err)
	}

	fi, err := os.Stat(g.Path2())
	if err != nil {
		t.Fatal(err)
	}
	if ino := fi.Sys().(*syscall.Stat_t).Ino; g.ID() != ino || ino == 0 {
		t.Errorf("ID() = %d, inode of %s = %d", g.ID(), g.Path2(), ino)
	}
}

func TestForkBombStopsAtPidsMax(t *testing.T) {
	m := newManager(t, Options{})
	// A bounded "bomb": 100 background sleeps from one shell loop. dash
	// gives up at its first refused fork ("Cannot fork").
	bomb := func(t *testing.T, pids int64) (members int, st Stats) {
		g, err := m.Create(ctx, fmt.Sprintf("bomb%d", pids+1), Limits{Pids: pids})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := g.Destroy(ctx); err != nil {
				t.Error(err)
			}
		}()
		sh := start(t, nil, "/bin/sh", "-c", `exec 2>/dev/null; read x; i=0; while [ $i -lt 100 ]; do i=$((i+1)); sleep 60 & done; echo done`)
		if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		sh.release(t)
		_ = sh.wait(t, 10*time.Second)
		procs, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		st, err = g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return len(procs), st
	}
	limited, st := bomb(t, 20)
	t.Logf("pids.max 20: %d processes left, %d forks refused", limited, st.PidsLimited)
	if limited > 20 || limited < 10 || st.PidsLimited < 1 {
		t.Errorf("with pids.max 20: %d processes, %d refusals", limited, st.PidsLimited)
	}
	// The proof the limit did it: unlimited, the same loop makes all 100.
	free, st := bomb(t, -1)
	t.Logf("no limit: %d processes left, %d forks refused", free, st.PidsLimited)
	if free != 100 || st.PidsLimited != 0 {
		t.Errorf("without a limit the loop made %d sleeps (%d refusals), want 100", free, st.PidsLimited)
	}
}

func TestMemoryLimitOOMKills(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "oom", Limits{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{roleEnv + "=alloc", "MB=256"}
	in := start(t, env, self)
	if err := g.AddProc(in.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	out := start(t, env, self) // the same, outside the group
	in.release(t)
	out.release(t)

	err = in.wait(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("allocating 256 MiB under a 64 MiB limit ended with %v, want SIGKILL", err)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d", st.OOMKills)
	}
	if st.MemoryPeak > 65<<20 || st.MemoryPeak < 32<<20 { // the peak may pass the limit by a page
		t.Errorf("MemoryPeak = %d, want near the 64 MiB limit", st.MemoryPeak)
	}
	if err := out.wait(t, 30*time.Second); err != nil {
		t.Errorf("the process outside the group: %v", err)
	}
}

func TestKillReapsFifty(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "fifty", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sh := start(t, nil, "/bin/sh", "-c", `read x; for i in $(seq 50); do sleep 600 & done; wait`)
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sh.release(t)
	waitFor(t, 10*time.Second, "51 processes", func() bool {
		p, _ := g.Procs()
		return len(p) == 51
	})
	t0 := time.Now()
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kill of 51 processes: %v", time.Since(t0))
	if p, err := g.Procs(); err != nil || len(p) != 0 {
		t.Errorf("after Kill: Procs = %v, %v", p, err)
	}
	for _, d := range g.dirs {
		if p, _ := readProcs(d); len(p) != 0 {
			t.Errorf("%s still lists %v", d, p)
		}
	}
	if err := g.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s remains after Destroy", d)
		}
	}
}

func TestSweep(t *testing.T) {
	m := newManager(t, Options{})
	for _, id := range []string{"a", "b", "c"} {
		g, err := m.Create(ctx, id, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if id == "c" {
			p := start(t, nil, "sleep", "60")
			if err := g.AddProc(p.cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A group a crash left in one hierarchy only.
	if err := os.Mkdir(filepath.Join(m.hier["pids"], m.parent, "partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.List(); !slices.Equal(got, []string{"a", "b", "c", "partial"}) {
		t.Fatalf("List = %v", got)
	}
	if err := m.Sweep(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.List(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after Sweep: List = %v", got)
	}
	for _, mnt := range m.mounts() {
		for _, id := range []string{"a", "c", "partial"} {
			if _, err := os.Stat(filepath.Join(mnt, m.parent, id)); err == nil {
				t.Errorf("%s/%s survived Sweep", mnt, id)
			}
		}
	}
}

// counter starts a shell that prints an increasing number every 10 ms and
// returns the latest number it printed.
func counter(t *testing.T, g *Group) func() int64 {
	t.Helper()
	sh := start(t, nil, "/bin/sh", "-c", `read x; i=0; while :; do i=$((i+1)); echo $i; sleep 0.01; done`)
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	var last atomic.Int64
	go func() {
		for {
			line, err := sh.stdout.ReadString('\n')
			if err != nil {
				return
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
			last.Store(n)
		}
	}()
	sh.release(t)
	waitFor(t, 5*time.Second, "the counter to count", func() bool { return last.Load() > 3 })
	return last.Load
}

func testFreezeThaw(t *testing.T, g *Group) {
	count := counter(t, g)
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := g.Stats(); err != nil || !st.Frozen {
		t.Errorf("Stats after Freeze: %+v, %v", st, err)
	}
	time.Sleep(50 * time.Millisecond) // lines already in the pipe
	before := count()
	time.Sleep(300 * time.Millisecond)
	if after := count(); after != before {
		t.Errorf("the counter went from %d to %d while frozen", before, after)
	}
	if err := g.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	thawed := count()
	waitFor(t, 5*time.Second, "the counter to resume", func() bool { return count() > thawed+3 })
	if st, err := g.Stats(); err != nil || st.Frozen {
		t.Errorf("Stats after Thaw: %+v, %v", st, err)
	}
}

func TestFreezeThaw(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "freeze", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	testFreezeThaw(t, g)
	// Kill works on a frozen group too.
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := g.Procs(); len(p) != 0 {
		t.Errorf("after Kill of a frozen group: %v", p)
	}
}

func TestStatsCPU(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "cpu", Limits{CPU: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy(ctx)
	sh := start(t, nil, "/bin/sh", "-c", `read x; while :; do :; done`)
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sh.release(t)
	time.Sleep(time.Second)
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1 s of a busy loop at CPU 0.2: %.3f CPU seconds", st.CPUSeconds)
	if st.CPUSeconds < 0.05 || st.CPUSeconds > 0.4 {
		t.Errorf("CPUSeconds = %.3f, want about 0.2", st.CPUSeconds)
	}
}

func TestOpenAfterRestart(t *testing.T) {
	m := newManager(t, Options{})
	g, err := m.Create(ctx, "survivor", Limits{Pids: 50})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, "sleep", "60")
	if err := g.AddProc(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	m2, err := New(ctx, Options{Parent: m.parent})
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := m2.List(); err != nil || !slices.Equal(ids, []string{"survivor"}) {
		t.Fatalf("List after restart = %v, %v", ids, err)
	}
	g2, err := m2.Open("survivor")
	if err != nil {
		t.Fatal(err)
	}
	if g2.ID() != g.ID() || g2.Path2() != g.Path2() {
		t.Errorf("reopened group: id %d path %s, was %d %s", g2.ID(), g2.Path2(), g.ID(), g.Path2())
	}
	if procs, _ := g2.Procs(); !slices.Equal(procs, []int{p.cmd.Process.Pid}) {
		t.Errorf("reopened Procs = %v", procs)
	}
	if err := g2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentCreateDestroy hammers the manager from
// several goroutines; run with -race.
func TestConcurrentCreateDestroy(t *testing.T) {
	m := newManager(t, Options{})
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			var err error
			for i := range 25 {
				var g *Group
				if g, err = m.Create(ctx, fmt.Sprintf("w%d-%d", w, i), Limits{MemoryBytes: 32 << 20}); err != nil {
					break
				}
				if err = g.Destroy(ctx); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := testenv.Recv(t, errs, time.Minute, "a concurrent create and destroy"); err != nil {
			t.Error(err)
		}
	}
	if ids, _ := m.List(); len(ids) != 0 {
		t.Errorf("left: %v", ids)
	}
}
