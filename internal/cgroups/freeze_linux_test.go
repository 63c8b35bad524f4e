package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestFreezeUnderLoad freezes, thaws and kills groups of many tasks on
// each layout while a CPU hog keeps every core busy, and a group with a
// task in uninterruptible sleep (a FUSE request nobody answers): Freeze
// must give up in time and leave the group thawed, Kill must give up in
// time naming the stuck task, and once the task can go on, Kill empties
// the group. A failed Freeze that left the group freezing (or a v1 Kill
// that waited on frozen tasks) hung the suite before.
func TestFreezeUnderLoad(t *testing.T) {
	hog(t)
	for _, mode := range []Mode{Detect, V1} {
		t.Run(mode.String(), func(t *testing.T) {
			m := newManager(t, Options{Mode: mode})
			t.Run("busy", func(t *testing.T) { testFreezeBusy(t, m) })
			t.Run("stuck", func(t *testing.T) { testFreezeStuck(t, m) })
		})
	}
}

// hog runs a busy loop on every CPU until the test ends.
func hog(t *testing.T) {
	for range runtime.NumCPU() {
		start(t, nil, "/bin/sh", "-c", "read x; while :; do :; done").release(t)
	}
}

// busyGroup makes a group running a shell with n sleeping and two
// spinning children, and returns it with a counter of the shell's output.
func busyGroup(t *testing.T, m *Manager, name string, n int) *Group {
	t.Helper()
	g, err := m.Create(ctx, name, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Destroy(ctx) })
	sh := start(t, nil, "/bin/sh", "-c", fmt.Sprintf(`read x; for i in $(seq %d); do sleep 600 & done; (while :; do :; done) & (while :; do :; done) & wait`, n))
	if err := g.AddProc(sh.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sh.release(t)
	waitFor(t, 20*time.Second, fmt.Sprintf("%d tasks in the group", n+3), func() bool {
		p, _ := g.Procs()
		return len(p) >= n+3
	})
	return g
}

func testFreezeBusy(t *testing.T, m *Manager) {
	g := busyGroup(t, m, "busy", 200)
	for i := range 5 {
		if err := g.Freeze(ctx); err != nil {
			t.Fatalf("freeze %d under load: %v", i, err)
		}
		if !g.Frozen() {
			t.Fatalf("freeze %d: Frozen() = false after Freeze", i)
		}
		if err := g.Thaw(ctx); err != nil {
			t.Fatalf("thaw %d: %v", i, err)
		}
	}
	// A Freeze whose time runs out at once either made it (v1 freezes
	// synchronously when every task stops at once) or gave up and
	// thawed.
	short, cancel := context.WithTimeout(ctx, time.Microsecond)
	err := g.Freeze(short)
	cancel()
	switch {
	case err == nil && !g.Frozen():
		t.Error("Freeze with no time succeeded and the group is not frozen")
	case err != nil && !errors.Is(err, ErrNotFrozen):
		t.Errorf("Freeze with no time = %v, want ErrNotFrozen", err)
	case err != nil && g.Frozen():
		t.Error("a Freeze that gave up left the group frozen")
	}
	// A Thaw whose context has ended still thaws.
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Thaw(done); err != nil {
		t.Errorf("Thaw with an ended context: %v", err)
	}
	if g.Frozen() {
		t.Error("Thaw with an ended context left the group frozen")
	}
	// KillExcept ends all but one task, frozen as the caller holds it.
	// (Not the shell, which ends when its children do.)
	procs, _ := g.Procs()
	keep := 0
	for _, pid := range procs {
		if comm, _, _ := taskState(pid); comm == "sleep" {
			keep = pid
		}
	}
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	killed := 0
	if err := g.KillExcept(ctx, keep, func(int) { killed++ }); err != nil {
		_, st, _ := taskState(keep)
		t.Fatalf("KillExcept(%d, state %s) of %d: %v", keep, st, len(procs), err)
	}
	if left, _ := g.Procs(); len(left) != 1 || left[0] != keep {
		t.Errorf("KillExcept left %v, want only %d", left, keep)
	}
	if killed < 200 {
		t.Errorf("KillExcept reported %d killed, want ≥ 200", killed)
	}
	if err := g.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := g.Kill(kctx); err != nil {
		t.Fatalf("Kill under load: %v", err)
	}
	if p, _ := g.Procs(); len(p) != 0 {
		t.Errorf("after Kill: %v", p)
	}
	if g.Frozen() {
		t.Error("Kill left the group frozen")
	}
}

func testFreezeStuck(t *testing.T, m *Manager) {
	fuse := testenv.NewStuckFUSE(t)
	g := busyGroup(t, m, "stuck", 20)
	st := start(t, nil, "/bin/sh", "-c", "read x; exec stat "+fuse.Dir+"/x")
	if err := g.AddProc(st.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	st.release(t)
	if !fuse.WaitRequest(10 * time.Second) {
		t.Fatal("stat's request did not reach the FUSE server in 10 s")
	}
	// A freeze cannot finish: the stat waits in the kernel.
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	began := time.Now()
	err := g.Freeze(fctx)
	cancel()
	if !errors.Is(err, ErrNotFrozen) {
		t.Fatalf("Freeze with a task in uninterruptible sleep = %v, want ErrNotFrozen", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("Freeze took %v to give up on a 1 s context", took)
	}
	if want := fmt.Sprintf("%d (stat, in ", st.cmd.Process.Pid); !strings.Contains(err.Error(), want) {
		t.Errorf("Freeze's error %q does not name the stuck task %s", err, want)
	}
	if g.Frozen() {
		t.Fatal("a Freeze that gave up left the group frozen")
	}
	// Kill cannot end it either, and says so in time.
	kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = g.Kill(kctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "(stat, in ") {
		t.Errorf("Kill with a task in uninterruptible sleep = %v, want an error naming it", err)
	}
	if g.Frozen() {
		t.Error("a Kill that gave up left the group frozen")
	}
	// Once the file system lets go, Kill ends everything.
	fuse.Release()
	kctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := g.Kill(kctx); err != nil {
		t.Fatalf("Kill after the release: %v", err)
	}
	if err := st.wait(t, 10*time.Second); err == nil {
		t.Error("the stuck stat exited 0")
	} else if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) {
		t.Errorf("the stuck stat: %v", err)
	}
}
