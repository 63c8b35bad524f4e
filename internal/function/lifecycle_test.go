package function

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPoolServesCalls(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{PoolSize: 3})
	sb := create(t, rt, nil)
	run(t, sb, "", "echo", "warm") // compiles, instantiates on the call path, kicks the refiller
	if m := rt.Metrics(); m.PoolMisses != 1 || m.PoolHits != 0 {
		t.Fatalf("after the first call: %+v", m)
	}
	waitFor(t, "the pool to fill", func() bool { return rt.Metrics().Instantiations == 4 })
	// Every tool is the same module, so they share the pool.
	for _, tool := range []string{"cat", "wc", "env"} {
		run(t, sb, "", tool)
	}
	m := rt.Metrics()
	if m.PoolMisses != 1 || m.PoolHits != 3 || m.Compilations != 1 {
		t.Errorf("after three warm calls: %+v", m)
	}
	waitFor(t, "the pool to refill", func() bool { return rt.Metrics().Instantiations == 7 })
}

func TestPoolIdleRelease(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{PoolSize: 2, PoolIdle: 50 * time.Millisecond})
	sb := create(t, rt, nil)
	run(t, sb, "", "echo", "warm")
	waitFor(t, "the pool to fill", func() bool { return rt.Metrics().Instantiations == 3 })
	m := func() *module {
		rt.mods.mu.Lock()
		defer rt.mods.mu.Unlock()
		for _, m := range rt.mods.mods {
			return m
		}
		return nil
	}()
	waitFor(t, "idle instances to be released", func() bool { return len(m.pool.ready) == 0 })
	run(t, sb, "", "echo", "again")
	if got := rt.Metrics().PoolMisses; got != 2 {
		t.Errorf("PoolMisses = %d after the pool was released, want 2", got)
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	dir := t.TempDir()
	rt, err := New(context.Background(), Options{StateDir: dir, CacheDir: testCacheDir, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	var sbs []*Sandbox
	for i := 0; i < 3; i++ {
		sb, err := rt.Create(context.Background(), sandbox.Spec{ID: "close-" + string(rune('a'+i)), Image: testImage(t), MemoryMB: 64, DiskMB: 8})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb.(*Sandbox))
	}
	for _, sb := range sbs {
		run(t, sb, "x", "cat")
		run(t, sb, "y", "tiny-echo")
	}
	// A call in progress when the runtime closes is stopped.
	done := make(chan api.ExecResult, 1)
	go func() {
		res, _ := sbs[0].Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"loop"}}})
		done <- res
	}()
	waitFor(t, "the loop to run", func() bool { return sbs[0].running.Load() == 1 })
	if err := sbs[2].Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := testenv.Recv(t, done, time.Minute, "the call Close stopped to return"); res.ExitCode != -1 || res.Error != "killed" {
		t.Errorf("call stopped by Close: %+v", res)
	}
	if _, err := sbs[1].Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo"}}}); err == nil {
		t.Errorf("Exec after Close succeeded")
	}
	waitGoroutines(t, before)

	// Close leaves sandboxes (and their mounts) for Recover; destroying the
	// recovered ones leaves no mount behind.
	rt2 := newRuntime(t, dir, Options{})
	got, err := rt2.Recover(context.Background())
	if err != nil || len(got) != 2 {
		t.Fatalf("Recover = %d sandboxes, %v; want 2", len(got), err)
	}
	for _, sb := range got {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := mounts(t, dir); len(m) != 0 {
		t.Errorf("mounts left under the state dir: %q", m)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(entries) != 0 {
		t.Errorf("sandbox directories left: %v", entries)
	}
}

func TestRecoverRemovesPartialAndLost(t *testing.T) {
	dir := t.TempDir()
	rt := newRuntime(t, dir, Options{})
	kept := create(t, rt, nil)
	lost, err := rt.Create(context.Background(), sandbox.Spec{ID: "lost", Image: testImage(t), MemoryMB: 64, DiskMB: 8})
	if err != nil {
		t.Fatal(err)
	}
	needTmpfs(t, lost.(*Sandbox))
	partial := filepath.Join(dir, "sandboxes", "partial", "workspace")
	if err := os.MkdirAll(partial, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// As after a reboot: the tmpfs is gone.
	if err := unmountWorkspace(filepath.Join(dir, "sandboxes", "lost", "workspace")); err != nil {
		t.Fatal(err)
	}
	rt2 := newRuntime(t, dir, Options{})
	got, err := rt2.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID() != kept.ID() {
		t.Fatalf("Recover returned %d sandboxes, want only %s", len(got), kept.ID())
	}
	for _, gone := range []string{"lost", "partial"} {
		if _, err := os.Stat(filepath.Join(dir, "sandboxes", gone)); !os.IsNotExist(err) {
			t.Errorf("%s sandbox left on disk: %v", gone, err)
		}
	}
	// kept's cleanup destroys it through the old value; do it through the
	// recovered one, which owns it now.
	if err := got[0].Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestWorkspaceFull(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, func(s *sandbox.Spec) { s.DiskMB = 1 })
	needTmpfs(t, sb)
	two := strings.Repeat("x", 2<<20)
	res := run(t, sb, two, "write", "/workspace/big")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "space") {
		t.Errorf("guest writing 2 MiB into 1 MiB: %+v", res)
	}
	_, err := sb.Files().Write(context.Background(), "/workspace/big2", strings.NewReader(two), sandbox.WriteOptions{})
	if !errors.Is(err, errdefs.TooLarge) || errdefs.CodeOf(err) != "workspace_full" {
		t.Errorf("files API writing 2 MiB into 1 MiB: err = %v, want TooLarge workspace_full", err)
	}
	st, err := sb.Stats(context.Background())
	if err != nil || st.DiskBytes <= 0 || st.DiskBytes > 1<<20 {
		t.Errorf("Stats = %+v, %v", st, err)
	}
	// Freeing space makes room again.
	if err := sb.Files().Remove(context.Background(), "/workspace/big", false); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files().Write(context.Background(), "/workspace/small", bytes.NewReader(make([]byte, 100<<10)), sandbox.WriteOptions{}); err != nil {
		t.Errorf("write after freeing space: %v", err)
	}
}

func TestCreateErrors(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	for _, tt := range []struct {
		name  string
		spec  sandbox.Spec
		class errdefs.Class
	}{
		{"duplicate ID", sandbox.Spec{ID: sb.ID(), Image: testImage(t)}, errdefs.Conflict},
		{"bad ID", sandbox.Spec{ID: "../x", Image: testImage(t)}, errdefs.Invalid},
		{"no image", sandbox.Spec{ID: "noimg"}, errdefs.Invalid},
		{"missing image", sandbox.Spec{ID: "missing", Image: sandbox.Image{Root: "/no/such/image"}}, errdefs.NotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := rt.Create(context.Background(), tt.spec); errdefs.ClassOf(err) != tt.class {
				t.Errorf("err = %v, want class %s", err, tt.class)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(rt.opts.StateDir, "sandboxes", "missing")); !os.IsNotExist(err) {
		t.Errorf("a failed Create left its directory: %v", err)
	}
	state, err := os.ReadFile(filepath.Join(sb.dir, "sandbox.json"))
	if err != nil || !bytes.Contains(state, []byte(`"ID":"`+sb.ID())) {
		t.Errorf("sandbox.json = %s, %v", state, err)
	}
}

func TestFingerprint(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	info := rt.Fingerprint(context.Background())
	if info.Name != "function" || !info.Available || info.Accelerator != "none" {
		t.Errorf("Fingerprint = %+v", info)
	}
	if compilerSupported() != (info.Reason == "") {
		t.Errorf("Reason %q with compilerSupported() = %v", info.Reason, compilerSupported())
	}
}

func TestPoolOfUninstantiableModule(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{PoolSize: 2})
	sb := create(t, rt, nil)
	// A valid command whose import no host provides: it compiles, but
	// every instantiation fails.
	mod := []byte("\x00asm\x01\x00\x00\x00" +
		"\x01\x04\x01\x60\x00\x00" + // type 0: () -> ()
		"\x02\x0b\x01\x03env\x03nop\x00\x00" + // import env.nop: type 0
		"\x03\x02\x01\x00" + // func 1: type 0
		"\x07\x0a\x01\x06_start\x00\x01" + // export _start = func 1
		"\x0a\x04\x01\x02\x00\x0b") // body: end
	if _, err := sb.Files().Write(context.Background(), "/workspace/imp.wasm", bytes.NewReader(mod), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"/workspace/imp.wasm"}}})
		if !errors.Is(err, errdefs.Invalid) || !strings.Contains(err.Error(), "env") {
			t.Fatalf("call %d: err = %v, want Invalid naming the missing import", i, err)
		}
	}
	if res := run(t, sb, "", "echo", "fine"); res.Stdout != "fine\n" {
		t.Errorf("echo after a broken module: %+v", res)
	}
}
