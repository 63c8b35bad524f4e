package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestCreateRefusesSocketPathTooLong checks that an ID too long for the
// node's state directory (its agent's socket path would not fit in a
// unix socket address) is refused up front, with nothing left behind.
func TestCreateRefusesSocketPathTooLong(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	id := strings.Repeat("x", 64)
	if len(filepath.Join(dir, "sandboxes", id, "sock", "agent.sock")) < maxSockPath {
		t.Skipf("the temporary directory %s is too short for the test", dir)
	}
	_, err := rt.Create(context.Background(), sandbox.Spec{ID: id, Image: w.image()})
	if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != "sandbox_id_too_long" {
		t.Fatalf("create with a 64-byte ID in %s: %v, want Invalid sandbox_id_too_long", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused sandbox's directory: %v", err)
	}
}

// TestRootsStayOutOfHostMountTable checks that a sandbox's root and upper
// never stay in the host's mount table (every new mount namespace copies
// that table: roots left there made each create slower by the number of
// sandboxes), while the sandbox sees its root and its upper's size, and
// that the host still reaches the root through the sandbox's first
// process.
func TestRootsStayOutOfHostMountTable(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	e := newIsoEnv(t, rt)
	var sbs []*Sandbox
	for i := range 3 {
		sbs = append(sbs, e.create(t, fmt.Sprintf("table%d", i), func(s *sandbox.Spec) { s.DiskMB = 24 }))
	}
	mounts, err := sys.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if strings.Contains(m, "/sandboxes/") || strings.Contains(m, "/roots/") {
			t.Errorf("a sandbox's mount in the host's table: %s", m)
		}
	}
	for _, sb := range sbs {
		run(t, sb, "sh", "-c", "echo hello > /tmp/mark")
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/mark", sb.state.Pid)); err != nil || string(b) != "hello\n" {
			t.Errorf("%s: the host reads %q (%v) through its first process's root", sb.id, b, err)
		}
		if res := run(t, sb, "sh", "-c", "df -k / | tail -1"); !strings.Contains(res.Stdout, " 24576 ") {
			t.Errorf("%s: df of its root: %q, want a 24 MiB file system", sb.id, res.Stdout)
		}
	}
	// Negative control: the same walk finds the layer mounts the cache
	// keeps in the host's table.
	if !slices.ContainsFunc(mounts, func(m string) bool { return strings.Contains(m, "/layers/") }) {
		t.Errorf("no layer mounts under %s: %v", dir, mounts)
	}
}

// TestForkerMountTable checks that sandboxes are forked from a mount
// namespace of a few mounts, whatever the host's table holds: a new
// mount namespace copies its parent's whole table.
func TestForkerMountTable(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	// 100 mounts more on the host.
	extra := filepath.Join(dir, "extra")
	for i := range 100 {
		p := filepath.Join(extra, strconv.Itoa(i))
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := sys.MountTmpfs("dsec-test", p, "size=4k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sys.Unmount(p) })
	}
	lines := func(path string) []string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	host := lines("/proc/self/mountinfo")
	rt.Runtime.forker.mu.Lock()
	tids := slices.Clone(rt.Runtime.forker.tids)
	rt.Runtime.forker.mu.Unlock()
	if len(tids) == 0 {
		t.Fatal("no forking threads")
	}
	for _, tid := range tids {
		ns := lines(fmt.Sprintf("/proc/self/task/%d/mountinfo", tid))
		if len(ns) > 40 || slices.ContainsFunc(ns, func(l string) bool { return strings.Contains(l, extra) }) {
			t.Errorf("thread %d forks from %d mounts (the host has %d):\n%s", tid, len(ns), len(host), strings.Join(ns, "\n"))
		}
	}
	// Negative control: the host's table holds the 100.
	if n := len(slices.DeleteFunc(host, func(l string) bool { return !strings.Contains(l, extra) })); n != 100 {
		t.Errorf("the host's table shows %d of the 100 extra mounts", n)
	}
	// Sandboxes still start and reach their sockets and roots; they are
	// the zygote's children, and it forks from the small namespace too.
	e := newIsoEnv(t, rt)
	sb := e.create(t, "small", nil)
	run(t, sb, "true")
	rt.Runtime.zmu.Lock()
	z := rt.Runtime.zygote
	rt.Runtime.zmu.Unlock()
	if z == nil {
		t.Fatal("no zygote")
	}
	if ns := lines(fmt.Sprintf("/proc/%d/mountinfo", z.pid)); len(ns) > 40 {
		t.Errorf("the zygote forks from %d mounts", len(ns))
	}
	stat := lines(fmt.Sprintf("/proc/%d/stat", sb.state.Pid))[0]
	if f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:]); len(f) < 2 || f[1] != strconv.Itoa(z.pid) {
		t.Errorf("the sandbox's parent: %v, want the zygote %d", f, z.pid)
	}
}

// TestZygoteRestarts checks that a create after the zygote died starts
// another, and that closing the runtime ends it.
func TestZygoteRestarts(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	e := newIsoEnv(t, rt)
	sb1 := e.create(t, "z1", nil)
	run(t, sb1, "true")
	zyg := func() *zygote {
		rt.Runtime.zmu.Lock()
		defer rt.Runtime.zmu.Unlock()
		return rt.Runtime.zygote
	}
	z := zyg()
	if z == nil {
		t.Fatal("no zygote")
	}
	if err := syscall.Kill(z.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, z.done, time.Minute, "the killed zygote to be reaped")
	sb2 := e.create(t, "z2", nil)
	run(t, sb2, "true")
	z2 := zyg()
	if z2 == nil || z2 == z || !z2.alive() {
		t.Fatalf("after the zygote died: %+v", z2)
	}
	// The first sandbox, whose parent died, still runs and goes.
	run(t, sb1, "true")
	ctx := context.Background()
	must(t, sb1.Destroy(ctx))
	must(t, sb2.Destroy(ctx))
	must(t, rt.Runtime.Close(ctx))
	select {
	case <-z2.done:
	default:
		t.Error("the zygote outlived the runtime")
	}
}

// TestZygoteAnswers checks the zygote's protocol: a request it cannot
// serve (no descriptors) is refused with the connection still in step,
// a request that cannot be sent (past its deadline) is an error of
// another kind (the runtime then drops the zygote), and sandboxes start
// after both.
func TestZygoteAnswers(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	e := newIsoEnv(t, rt)
	run(t, e.create(t, "a1", nil), "true")
	rt.Runtime.zmu.Lock()
	z := rt.Runtime.zygote
	rt.Runtime.zmu.Unlock()
	if z == nil {
		t.Fatal("no zygote")
	}
	if _, _, _, err := z.start(context.Background(), setup.ZygoteRequest{}, nil); !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "descriptors") {
		t.Errorf("a request without descriptors: %v, want a refusal", err)
	}
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, _, _, err := z.start(past, setup.ZygoteRequest{}, nil); err == nil || errors.Is(err, errRefused) {
		t.Errorf("a request past its deadline: %v, want a transport error", err)
	}
	if !z.alive() {
		t.Error("the zygote died")
	}
	run(t, e.create(t, "a2", nil), "true")
}

// alive reports whether the zygote process still runs.
func (z *zygote) alive() bool {
	select {
	case <-z.done:
		return false
	default:
		return true
	}
}

// TestMountinfoNamesNoHostPath checks that a sandbox's mount table names
// no path of the node's. The root overlay's options, which
// /proc/self/mountinfo shows, named the layer cache's directories and
// the sandbox's state directory (the node's data directory): where an
// escape would aim.
func TestMountinfoNamesNoHostPath(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	sb := createIn(t, rt, sandbox.Spec{ID: "mountinfo", Image: w.image()}, nil)
	res := run(t, sb, "cat", "/proc/self/mountinfo", "/proc/self/mounts")
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, " / / ") || !strings.Contains(res.Stdout, "overlay") {
		t.Fatalf("the sandbox's mount table: %+v", res)
	}
	for _, host := range []string{tempTop(dir), w.dir} {
		for line := range strings.Lines(res.Stdout) {
			if strings.Contains(line, host) {
				t.Errorf("the sandbox's mount table names the host's %s: %s", host, line)
			}
		}
	}
}
