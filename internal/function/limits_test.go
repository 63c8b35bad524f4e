package function

// Modules that try to take the server's memory through what the memory
// limit of linear memory alone does not see: tables, the call stack, and
// the declarations an instance allocates. Each asserts the clean refusal
// and measures the process's peak resident memory across the attempt.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/wasmopt"
	"github.com/tetratelabs/wazero"
	wapi "github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// wat compiles WebAssembly text with wabt's wat2wasm.
func wat(t testing.TB, src string) []byte {
	t.Helper()
	bin, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skipf("could not find wat2wasm (Debian package wabt): %v", err)
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "m.wat"), filepath.Join(dir, "m.wasm")
	if err := os.WriteFile(in, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(bin, in, "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// install writes module b to /workspace/<name>.wasm and returns its path.
func install(t *testing.T, sb *Sandbox, name string, b []byte) string {
	t.Helper()
	p := "/workspace/" + name + ".wasm"
	if _, err := sb.Files().Write(context.Background(), p, bytes.NewReader(b), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// exec runs argv without failing the test on an error.
func execErr(sb *Sandbox, argv ...string) (api.ExecResult, error) {
	return sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: argv, TimeoutS: 60}})
}

// peakGrowth runs f and returns how far the process's resident memory
// peaked above where it was before (VmHWM, reset through clear_refs).
// Under the race detector, whose shadow memory multiplies the Go heap, it
// runs f and returns 0: the bounds are checked by the ordinary runs.
func peakGrowth(t *testing.T, f func()) int64 {
	t.Helper()
	if raceEnabled {
		f()
		return 0
	}
	runtime.GC()
	debug.FreeOSMemory()
	base := vmRSS(t)
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Logf("cannot reset the peak (%v): measuring the resident memory after", err)
		f()
		return vmRSS(t) - base
	}
	f()
	return statusKB(t, "VmHWM:") - base
}

func statusKB(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// checkNoInstanceLeak: after the calls, the runtime holds no instance but
// those ready in pools (once the refillers are done: up to 5 s), and the
// sandbox no memory.
func checkNoInstanceLeak(t *testing.T, rt *Runtime, sb *Sandbox) {
	t.Helper()
	var live, ready int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ready = 0
		rt.mods.mu.Lock()
		for _, m := range rt.mods.mods {
			ready += int64(len(m.pool.ready))
		}
		rt.mods.mu.Unlock()
		if live = rt.Metrics().Instances; live == ready || time.Now().After(deadline) {
			break
		}
	}
	if live != ready {
		t.Errorf("%d instances alive 5 s after the calls, %d of them ready in pools", live, ready)
	}
	if st, err := sb.Stats(context.Background()); err != nil || st.MemoryBytes != 0 {
		t.Errorf("Stats = %+v, %v; want MemoryBytes 0", st, err)
	}
}

// exitWith is a command that runs body and exits with the i32 it leaves.
func exitWith(decls, body string) string {
	return `(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  ` + decls + `
  (func (export "_start") (call $exit ` + body + `)))`
}

// growTable grows a funcref table by n entries: exit 0 if it grew, 3 if
// table.grow returned -1.
func growTable(n int) string {
	return exitWith(`(table $t 0 funcref)`,
		fmt.Sprintf(`(if (result i32) (i32.eq (table.grow $t (ref.null func) (i32.const %d)) (i32.const -1))
      (then (i32.const 3)) (else (i32.const 0)))`, n))
}

// recurse calls a function n deep; exit 0 when it returns.
func recurse(n int) string {
	return exitWith(`(func $down (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n))
      (then (i32.const 0))
      (else (i32.add (i32.const 1) (call $down (i32.sub (local.get $n) (i32.const 1)))))))`,
		fmt.Sprintf(`(i32.sub (call $down (i32.const %d)) (i32.const %d))`, n, n))
}

func TestTableGrowCounts(t *testing.T) {
	rt, sink := auditedRuntime(t)
	sb := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 64 })
	attack := install(t, sb, "grow", wat(t, growTable(1<<26)))
	var res api.ExecResult
	growth := peakGrowth(t, func() { res = run(t, sb, "", attack) })
	t.Logf("table.grow of 2^26 entries under 64 MiB: %+v, peak resident memory +%d MiB", res, growth>>20)
	if res.ExitCode != 3 {
		t.Errorf("table.grow of 2^26 entries (512 MiB) under 64 MiB: exit %d, want 3 (grow refused)", res.ExitCode)
	}
	if growth > 64<<20 {
		t.Errorf("the process grew %d MiB for a sandbox of 64 MiB", growth>>20)
	}
	// Control: a table of 1,000 entries grows, and a table just under the
	// limit (what 48 MiB of growth is charged) too.
	for _, n := range []int{1000, 3 << 20} {
		if res := run(t, sb, "", install(t, sb, "ok", wat(t, growTable(n)))); res.ExitCode != 0 {
			t.Errorf("table.grow of %d entries under 64 MiB: %+v", n, res)
		}
	}
	if n := sink.count(sb.ID(), "memory-limit"); n != 0 {
		t.Errorf("%d memory-limit events; a refused table.grow returns -1 and is not one", n)
	}
	checkNoInstanceLeak(t, rt, sb)
}

func TestDeepRecursionCounts(t *testing.T) {
	rt, sink := auditedRuntime(t)
	sb := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 16 })
	attack := install(t, sb, "deep", wat(t, recurse(50_000_000)))
	var res api.ExecResult
	growth := peakGrowth(t, func() { res = run(t, sb, "", attack) })
	t.Logf("recursion 5e7 deep under 16 MiB: %+v, peak resident memory +%d MiB", res, growth>>20)
	if res.ExitCode != -1 || !strings.HasPrefix(res.Error, "wasm trap: stack overflow") || !strings.Contains(res.Error, "memory limit") {
		t.Errorf("recursion 5e7 deep: %+v, want exit -1 and a stack overflow at the memory limit", res)
	}
	if growth > 48<<20 {
		t.Errorf("the process grew %d MiB for a sandbox of 16 MiB", growth>>20)
	}
	if n := sink.count(sb.ID(), "memory-limit"); n != 1 {
		t.Errorf("%d memory-limit events, want 1 (the overflow)", n)
	}
	// Control: recursion 10,000 deep returns.
	if res := run(t, sb, "", install(t, sb, "ok", wat(t, recurse(10_000)))); res.ExitCode != 0 {
		t.Errorf("recursion 10,000 deep under 16 MiB: %+v", res)
	}
	// A Go tool, whose runtime grows memory to the limit and then reports
	// it, still can: the stack keeps a reserve.
	if res := run(t, sb, "", "alloc", "64"); res.ExitCode != 2 || !strings.Contains(res.Stderr, "out of memory") {
		t.Errorf("alloc 64 under 16 MiB: %+v, want Go's out of memory", res)
	}
	checkNoInstanceLeak(t, rt, sb)
}

// TestStackEstimateResidual pins what the stack estimate does not cover: a
// function that sets a local before each of many calls gets a spill slot
// per version of the local in wazero's compiler, a frame of some 9 KiB
// charged 240 bytes. Such recursion ends at wazero's own ceiling (about
// 80 MiB of stack per call), cleanly.
func TestStackEstimateResidual(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 16 })
	src := exitWith(`(global $s (mut f64) (f64.const 0))
  (func $g (global.set $s (f64.add (global.get $s) (f64.const 1))))
  (func $f (local $x f64)
    (local.set $x (global.get $s))
    `+strings.Repeat("(local.set $x (f64.add (local.get $x) (f64.const 1))) (call $g)\n", 1000)+`
    (call $f)
    (global.set $s (local.get $x)))`, `(call $f) (i32.const 0)`)
	var res api.ExecResult
	growth := peakGrowth(t, func() { res = run(t, sb, "", install(t, sb, "spill", wat(t, src))) })
	t.Logf("spilling recursion under 16 MiB: %+v, peak resident memory +%d MiB", res, growth>>20)
	if res.ExitCode != -1 || !strings.Contains(res.Error, "stack overflow") {
		t.Errorf("spilling recursion: %+v, want a stack overflow", res)
	}
	if growth > 256<<20 {
		t.Errorf("the process grew %d MiB: more than wazero's ceiling on a call's stack", growth>>20)
	}
}

func TestDeclaredSizes(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 32 })
	for _, tt := range []struct {
		name string
		mod  func(t *testing.T) []byte
		code string
	}{
		// What instances would hold is counted before one is made.
		{"table of 8M entries (64 MiB)", func(t *testing.T) []byte { return wat(t, exitWith(`(table 8000000 funcref)`, `(i32.const 0)`)) }, "memory_limit"},
		{"1 GiB initial memory", func(t *testing.T) []byte { return wat(t, exitWith(`(memory 16384)`, `(i32.const 0)`)) }, "memory_limit"},
		{"700,000 element entries", func(t *testing.T) []byte {
			return wat(t, exitWith(`(func $f) (elem func `+strings.Repeat("$f ", 700_000)+`)`, `(i32.const 0)`))
		}, "memory_limit"},
		// Past what any sandbox may ask: refused at load.
		{"table of 2^27 entries", func(t *testing.T) []byte { return wat(t, exitWith(`(table 134217728 funcref)`, `(i32.const 0)`)) }, "module_limit"},
		{"4e9 locals in 45 bytes", func(t *testing.T) []byte { return localsBomb() }, "module_limit"},
		{"100,001 globals", func(t *testing.T) []byte {
			return wat(t, exitWith(strings.Repeat("(global i32 (i32.const 0))", 100_001), `(i32.const 0)`))
		}, "module_limit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := install(t, sb, "m", tt.mod(t))
			before := rt.Metrics().Instantiations
			var err error
			growth := peakGrowth(t, func() { _, err = execErr(sb, p) })
			if !errors.Is(err, errdefs.TooLarge) || errdefs.CodeOf(err) != tt.code {
				t.Errorf("err = %v, want TooLarge %s", err, tt.code)
			}
			if n := rt.Metrics().Instantiations - before; n != 0 {
				t.Errorf("%d instances made of a module the sandbox cannot run", n)
			}
			// Compiling is not free (some 60 MiB for the element entries),
			// instances would be: 64 MiB, and pooled ones more.
			if growth > 96<<20 {
				t.Errorf("the process grew %d MiB", growth>>20)
			}
		})
	}
	// Control: an instance within the limit runs.
	if res := run(t, sb, "", install(t, sb, "ok", wat(t, exitWith(`(table 1000 funcref) (memory 16)`, `(i32.const 0)`)))); res.ExitCode != 0 {
		t.Errorf("control: %+v", res)
	}
	checkNoInstanceLeak(t, rt, sb)

	// An instance taking 16 MiB before it runs is made for its call, not
	// kept ready in a pool before any sandbox's limit is known.
	big := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 128 })
	if res := run(t, big, "", install(t, big, "big", wat(t, exitWith(`(table 2000000 funcref)`, `(i32.const 0)`)))); res.ExitCode != 0 {
		t.Errorf("a table of 2M entries under 128 MiB: %+v", res)
	}
	rt.mods.mu.Lock()
	for _, m := range rt.mods.mods {
		if m.prepared > maxPooledBytes && cap(m.pool.ready) != 0 {
			t.Errorf("a module whose instances take %d MiB before they run is pooled", m.prepared>>20)
		}
	}
	rt.mods.mu.Unlock()
	checkNoInstanceLeak(t, rt, big)
}

// localsBomb is a command of 45 bytes whose one other function declares
// 4e9 i64 locals (wazero's decoder would allocate 4 GB for their types).
func localsBomb() []byte {
	body := []byte{1, 0x80, 0xd0, 0xac, 0xf3, 0x0e, 0x7e, 0x0b} // 1 entry: 4e9 × i64; end
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = append(b, 1, 4, 1, 0x60, 0, 0) // type () -> ()
	b = append(b, 3, 3, 2, 0, 0)       // two functions
	b = append(b, 7, 10, 1, 6)         // export "_start" = function 1
	b = append(b, "_start"...)
	b = append(b, 0, 1)
	code := append([]byte{2, byte(len(body))}, body...)
	code = append(code, 2, 0, 0x0b)
	b = append(b, 10, byte(len(code)))
	return append(b, code...)
}

func TestStartFunctionBounded(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	// A start section runs at instantiation, before a call's room is set:
	// it gets wasmopt.InitialRoom.
	src := `(module
  (func $down (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n)) (then (i32.const 0))
      (else (call $down (i32.sub (local.get $n) (i32.const 1))))))
  (func $init (drop (call $down (i32.const 50000000))))
  (start $init)
  (func (export "_start")))`
	var err error
	growth := peakGrowth(t, func() { _, err = execErr(sb, install(t, sb, "start", wat(t, src))) })
	if !errors.Is(err, errdefs.Invalid) || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("deep recursion in a start function: %v, want an instantiation trap", err)
	}
	if growth > 32<<20 {
		t.Errorf("the process grew %d MiB", growth>>20)
	}
	// Table growth in a start function is charged to that room, and the
	// call's room is what the limit leaves after it.
	for n, want := range map[int]int{1000: 0, 70_000: 1} { // 70,000 entries are charged 1.1 MB
		src := exitWith(fmt.Sprintf(`(table $t 0 funcref)
  (func $init (drop (table.grow $t (ref.null func) (i32.const %d))))
  (start $init)`, n), fmt.Sprintf(`(i32.sub (i32.const 1) (i32.eq (table.size $t) (i32.const %d)))`, n))
		if res := run(t, sb, "", install(t, sb, "grow", wat(t, src))); res.ExitCode != want {
			t.Errorf("a start function growing a table by %d: %+v, want exit %d", n, res, want)
		}
	}
	// Unresolvable imports fail cleanly too.
	for _, imp := range []string{
		`(import "env" "f" (func))`,
		`(import "wasi_snapshot_preview1" "memory" (memory 1))`,
		`(import "wasi_snapshot_preview1" "table" (table 1 funcref))`,
	} {
		if _, err := execErr(sb, install(t, sb, "imp", wat(t, `(module `+imp+` (func (export "_start")))`))); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("%s: %v, want Invalid", imp, err)
		}
	}
	if res := run(t, sb, "", "echo", "ok"); res.Stdout != "ok\n" {
		t.Errorf("control: %+v", res)
	}
	checkNoInstanceLeak(t, rt, sb)
}

// TestFixedCosts measures what instances hold for their declarations and
// checks it against the costs charged (account.go), so that a wazero
// upgrade that makes them dearer fails here.
func TestFixedCosts(t *testing.T) {
	const n = 20_000
	items := func(s string) string { return strings.Repeat(s, n) }
	for _, tt := range []struct {
		name string
		decl string
	}{
		{"tables", strings.Repeat("(table 0 funcref)", 1000)},
		{"table entries", fmt.Sprintf("(table %d funcref)", n)},
		{"element entries", "(func $f) (elem func " + items("$f ") + ")"},
		{"globals", items("(global (mut i32) (i32.const 0))")},
		{"imports", items(`(import "wasi_snapshot_preview1" "sched_yield" (func (result i32)))`)},
		{"data segments", "(memory 1)" + items(`(data (i32.const 0) "x")`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := wat(t, `(module `+tt.decl+` (func (export "_start")))`)
			out, info, err := wasmopt.Meter(b, wasmopt.DefaultLimits)
			if err != nil {
				t.Fatal(err)
			}
			empty, infoEmpty, err := wasmopt.Meter(wat(t, `(module (func (export "_start")))`), wasmopt.DefaultLimits)
			if err != nil {
				t.Fatal(err)
			}
			per := func(mod []byte) int64 {
				ctx := context.Background()
				r := wazero.NewRuntime(ctx)
				defer r.Close(ctx)
				wasi_snapshot_preview1.MustInstantiate(ctx, r)
				cm, err := r.CompileModule(ctx, mod)
				if err != nil {
					t.Fatal(err)
				}
				const k = 4
				mods := make([]wapi.Module, 0, k)
				runtime.GC()
				h0 := heapAlloc()
				for range k {
					m, err := r.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName("").WithStartFunctions())
					if err != nil {
						t.Fatal(err)
					}
					mods = append(mods, m)
				}
				runtime.GC()
				h := (heapAlloc() - h0) / k
				runtime.KeepAlive(mods)
				return h
			}
			measured := per(out) - per(empty)
			charged := int64(fixedBytes(info) - fixedBytes(infoEmpty))
			t.Logf("%s: %d bytes per instance, %d charged", tt.name, measured, charged)
			// A few KiB of the heap are other goroutines' allocations.
			if measured > charged+8<<10 {
				t.Errorf("an instance holds %d bytes for its %s; %d are charged", measured, tt.name, charged)
			}
		})
	}
}

// TestFrameEstimate checks wasmopt.FrameBytes against the frames wazero's
// compiler lays out for functions whose frames are their locals: the
// depth at which unmetered recursion overflows wazero's stack (some 80
// MiB) gives the real frame.
func TestFrameEstimate(t *testing.T) {
	if !compilerSupported() {
		t.Skip("no wazero compiler here: the interpreter's stack is another matter")
	}
	const wazeroStack = 83_886_080 // the first 10 KiB doubling past wazero's 50 MB ceiling
	for _, locals := range []int{0, 1, 10, 100, 1000} {
		t.Run(strconv.Itoa(locals), func(t *testing.T) {
			var decl, set, sum strings.Builder
			sum.WriteString("(global.get $s)")
			for i := range locals {
				decl.WriteString(" i64")
				fmt.Fprintf(&set, "(local.set %d (i64.add (local.get %d) (i64.extend_i32_u (global.get $d))))", i, i)
				s := sum.String()
				sum.Reset()
				fmt.Fprintf(&sum, "(i64.add %s (local.get %d))", s, i)
			}
			localDecl := ""
			if locals > 0 {
				localDecl = "(local" + decl.String() + ")"
			}
			src := `(module
  (global $d (export "depth") (mut i32) (i32.const 0))
  (global $s (mut i64) (i64.const 0))
  (func $f ` + localDecl + `
    (global.set $d (i32.add (global.get $d) (i32.const 1)))
    ` + set.String() + `
    (call $f)
    (global.set $s ` + sum.String() + `))
  (func (export "_start") (call $f)))`
			ctx := context.Background()
			r := wazero.NewRuntime(ctx)
			defer r.Close(ctx)
			mod, err := r.InstantiateWithConfig(ctx, wat(t, src), wazero.NewModuleConfig().WithStartFunctions())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mod.ExportedFunction("_start").Call(ctx); err == nil || !strings.Contains(err.Error(), "stack overflow") {
				t.Fatalf("unbounded recursion: %v", err)
			}
			depth := mod.ExportedGlobal("depth").Get()
			real := wazeroStack / depth
			est := wasmopt.FrameBytes(uint32(locals), 0)
			t.Logf("%d locals: overflow at depth %d, frame about %d bytes, charged %d", locals, depth, real, est)
			if real > est {
				t.Errorf("a frame of %d locals takes about %d bytes; %d are charged", locals, real, est)
			}
		})
	}
}

// TestRefusedCheckoutKeepsUsage: a memory refused at checkout (larger than
// the limit) takes nothing off the sandbox's usage when it is freed.
func TestRefusedCheckoutKeepsUsage(t *testing.T) {
	p := newMemPool()
	defer p.close()
	for name, mem := range map[string]linearMemory{"region": p.allocate(16 * pageSize), "slice": &sliceMemory{max: 16 * pageSize}} {
		if mem.Reallocate(4*pageSize) == nil { // instantiation: the initial size
			t.Fatalf("%s: Reallocate refused the initial size", name)
		}
		var usage atomic.Int64
		if mem.checkout(2*pageSize, &usage, nil) {
			t.Errorf("%s: checkout of 4 pages under a limit of 2 succeeded", name)
		}
		mem.Free()
		if u := usage.Load(); u != 0 {
			t.Errorf("%s: usage %d after a refused checkout and Free, want 0", name, u)
		}
	}
}
