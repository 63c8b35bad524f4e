package container

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// pidWatch keeps a pidfd of every process a test hook saw, to check
// later that each is gone.
type pidWatch struct {
	mu  sync.Mutex
	fds map[int]*sys.Pidfd
}

// add opens a pidfd of pid (a process the zygote just answered for: it
// waits for its config, so the pid is its).
func (w *pidWatch) add(t *testing.T, pid int) {
	fd, err := sys.OpenPidfd(pid)
	if err != nil {
		t.Errorf("the zygote answered pid %d, which is gone already: %v", pid, err)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fds == nil {
		w.fds = map[int]*sys.Pidfd{}
	}
	w.fds[pid] = fd
}

// gone fails the test for each process that still runs after 15 s, and
// kills it.
func (w *pidWatch) gone(t *testing.T, what string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.fds) == 0 {
		t.Fatalf("%s: the hook saw no process", what)
	}
	for pid, fd := range w.fds {
		if err := fd.Wait(15 * time.Second); err != nil {
			t.Errorf("%s: process %d still runs (%v), outside every cgroup of the sandbox", what, pid, err)
			_ = fd.Kill()
			_ = fd.Wait(10 * time.Second)
		}
		fd.Close()
	}
	w.fds = nil
}

// TestLostZygoteAnswer checks a create whose first zygote answer was
// lost, as an answer that comes after its deadline is under overload:
// the node drops that zygote and asks another, and the process the lost
// answer named must not survive. It shared the create's descriptors with
// the second process once: the first of the two to read the config got
// it, and that was the one the node never put in the sandbox's cgroups,
// left running outside them as the sandbox's agent.
func TestLostZygoteAnswer(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	e := newIsoEnv(t, rt)
	var lost pidWatch
	answers := 0
	rt.testZygoteAnswer = func(pid int) error {
		if answers++; answers > 1 {
			return nil
		}
		lost.add(t, pid)
		// Give the process time to wait for its config (as the late
		// answer's process had, while the node timed out).
		time.Sleep(200 * time.Millisecond)
		return errors.New("test: the answer came after its deadline")
	}
	sb := e.create(t, "lost-answer", nil)
	if res := run(t, sb, "echo", "ok"); res.Stdout != "ok\n" {
		t.Fatalf("the sandbox after a lost answer: %+v", res)
	}
	lost.gone(t, "the lost answer's process")
	// The agent the node talks to is the process in the sandbox's
	// cgroups: it kills a command the node started.
	procs, err := sb.cg.Procs()
	if err != nil || !slices.Contains(procs, sb.state.Pid) {
		t.Errorf("the sandbox's first process %d is not in its cgroup: %v, %v", sb.state.Pid, procs, err)
	}
}

// TestFailedCreateKillsItsProcess checks that a create that fails after
// the fork leaves no process of it, wherever it failed: before the
// process joined its cgroups (where the cgroup's kill cannot reach it),
// or at the zygote, whose every answer was lost.
func TestFailedCreateKillsItsProcess(t *testing.T) {
	w := world.get(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		set  func(rt *testRuntime, watch *pidWatch)
	}{
		{"before-cgroup-join", func(rt *testRuntime, watch *pidWatch) {
			rt.testBeforeJoin = func(pid int) error {
				watch.add(t, pid)
				return errors.New("test: the cgroup join failed")
			}
		}},
		{"answers-lost", func(rt *testRuntime, watch *pidWatch) {
			rt.testZygoteAnswer = func(pid int) error {
				watch.add(t, pid)
				return errors.New("test: the answer came after its deadline")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Cleanup(func() { checkHost(t, dir) })
			rt := newRuntime(t, dir, runtimeOptions{})
			var watch pidWatch
			tc.set(rt, &watch)
			if sb, err := rt.Create(ctx, sandbox.Spec{ID: "fails", Image: w.image()}); err == nil {
				_ = sb.Destroy(ctx)
				t.Fatal("the create succeeded")
			}
			watch.gone(t, "the failed create's process")
			if ents, err := os.ReadDir(rt.sandboxDir("")); err != nil || len(ents) > 0 {
				t.Errorf("the failed create left %v (%v)", ents, err)
			}
		})
	}
}

// plantStray forks a sandbox's first process through rt as a create
// does and leaves it as a node that died between the fork and the
// cgroup join would: in none of the sandbox's cgroups, its sandbox
// directory gone (it holds its deleted console log), waiting for a
// config that never comes (the test holds the config pipe). It returns
// its pidfd; the test's end kills it if it is still there.
func plantStray(t *testing.T, rt *testRuntime, id string) *sys.Pidfd {
	t.Helper()
	ctx := context.Background()
	exe, release, err := rt.findGuest(ctx, world.get(t).busybox)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	dir := rt.sandboxDir(id)
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	var files startFiles
	t.Cleanup(files.close)
	if err := files.open(dir); err != nil {
		t.Fatal(err)
	}
	bin, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	ns, err := sys.OpenNetns("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	root, err := os.Open("/dev/null") // never attached
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	owner, err := rt.owners.take()
	if err != nil {
		t.Fatal(err)
	}
	_, child, _, err := rt.fork(ctx, ns, true, files.console, []*os.File{files.cfgR, files.syncW, files.guestConn, root, bin}, owner)
	if err != nil {
		t.Fatal(err)
	}
	files.started()
	t.Cleanup(func() {
		_ = child.Kill()
		if err := child.Wait(10 * time.Second); err != nil {
			t.Errorf("a planted stray: %v", err)
		}
		child.Close()
	})
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	return child
}

// TestRecoverKillsStrays checks that a node's start-up recovery kills
// the sandbox processes a crashed node left outside every cgroup, found
// by what they are (PID 1 of a pid namespace, running as one of the
// node's ids, with the node's mark), and nothing of another node's: one
// with another id range, and one with the same range but another state
// directory (the test runtimes of other packages and processes share
// DefaultIDBase). The recovery before swept cgroups only, and the stray
// was in none.
func TestRecoverKillsStrays(t *testing.T) {
	world.get(t)
	ctx := context.Background()
	// Ranges no other test uses.
	const base = 5_000_000
	dir, otherDir, sameDir := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{dir, otherDir, sameDir} {
		t.Cleanup(func() { checkHost(t, d) })
	}
	rt := newRuntime(t, dir, runtimeOptions{hostUID: base})
	other := newRuntime(t, otherDir, runtimeOptions{hostUID: base + 65536})
	same := newRuntime(t, sameDir, runtimeOptions{hostUID: base})
	stray := plantStray(t, rt, "stray")
	otherStray := plantStray(t, other, "other")
	sameStray := plantStray(t, same, "same")

	// The node stops (its zygote, the strays' parent, goes with it) and
	// starts again.
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rt = newRuntime(t, dir, runtimeOptions{hostUID: base})
	if _, err := rt.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if err := stray.Wait(15 * time.Second); err != nil {
		t.Errorf("the node's stray after its recovery: %v", err)
	}
	for what, fd := range map[string]*sys.Pidfd{"another range's": otherStray, "another node's of the same range": sameStray} {
		if err := fd.Wait(100 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s stray after the recovery: %v, want it running", what, err)
		}
	}
}
