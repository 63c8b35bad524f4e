package wasmopt

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/wasmtools"
	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
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

// metered is an instance of a metered module.
type metered struct {
	mod         api.Module
	stack, room api.MutableGlobal
}

func instantiateMetered(t *testing.T, r wazero.Runtime, b []byte, cfg wazero.ModuleConfig) metered {
	t.Helper()
	out, _, err := Meter(b, DefaultLimits)
	if err != nil {
		t.Fatalf("Meter: %v", err)
	}
	mod, err := r.InstantiateWithConfig(context.Background(), out, cfg.WithName("").WithStartFunctions())
	if err != nil {
		t.Fatalf("instantiating the metered module: %v", err)
	}
	t.Cleanup(func() { mod.Close(context.Background()) })
	m := metered{mod: mod}
	var ok bool
	if m.stack, ok = mod.ExportedGlobal(StackGlobal).(api.MutableGlobal); !ok {
		t.Fatalf("no mutable %s", StackGlobal)
	}
	if m.room, ok = mod.ExportedGlobal(RoomGlobal).(api.MutableGlobal); !ok {
		t.Fatalf("no mutable %s", RoomGlobal)
	}
	return m
}

func (m metered) call(t *testing.T, name string, args ...uint64) ([]uint64, error) {
	t.Helper()
	f := m.mod.ExportedFunction(name)
	if f == nil {
		t.Fatalf("no function %s", name)
	}
	return f.Call(context.Background(), args...)
}

func TestMeterGoModule(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(wasmtools.ForTest(t), "bin", "echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	_, info, err := Meter(b, DefaultLimits)
	if err != nil {
		t.Fatalf("Meter: %v", err)
	}
	if info.Tables != 1 || info.TableEntries == 0 || !info.HasMemory || info.DataSegments == 0 || info.Globals < 3 {
		t.Errorf("Info = %+v", info)
	}
	t.Logf("Info = %+v", info)
	r := newRuntime(t)
	var stdout bytes.Buffer
	m := instantiateMetered(t, r, b, wazero.NewModuleConfig().WithArgs("echo", "metered").WithStdout(&stdout))
	m.room.Set(64 << 20)
	if _, err := m.call(t, "_start"); err == nil || !strings.Contains(err.Error(), "exit_code(0)") {
		t.Fatalf("_start: %v", err)
	}
	if stdout.String() != "metered\n" {
		t.Errorf("stdout %q", stdout.String())
	}
	if s := m.stack.Get(); s == 0 || s == StackOverflow {
		t.Errorf("%s = %d after a call", StackGlobal, s)
	}
	// The rewrite keeps MergeData's output and is deterministic.
	merged, err := MergeData(b)
	if err != nil {
		t.Fatal(err)
	}
	out2, _, err := Meter(merged, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if again, _, _ := Meter(merged, DefaultLimits); !bytes.Equal(out2, again) {
		t.Error("Meter is not deterministic")
	}
	// Metering twice is refused: the names are taken.
	if _, _, err := Meter(out2, DefaultLimits); !errors.Is(err, ErrUnsupported) {
		t.Errorf("metering a metered module: %v, want ErrUnsupported", err)
	}
}

const recursion = `(module
  (func $down (export "down") (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n))
      (then (i32.const 0))
      (else (i32.add (i32.const 1) (call $down (i32.sub (local.get $n) (i32.const 1))))))))`

func TestMeterStack(t *testing.T) {
	r := newRuntime(t)
	m := instantiateMetered(t, r, wat(t, recursion), wazero.NewModuleConfig())
	m.room.Set(1 << 20)
	if _, err := m.call(t, "down", 0); err != nil {
		t.Fatal(err)
	}
	// One parameter, calls of one parameter and result, a few operands.
	frame := m.stack.Get()
	if frame < FrameBytes(1, 1) || frame > FrameBytes(1+8, 1) {
		t.Fatalf("down's frame is charged %d bytes", frame)
	}
	m.room.Set(1000 * frame)
	for _, depth := range []uint64{0, 10, 998} { // the outermost call takes a frame too
		m.stack.Set(0)
		res, err := m.call(t, "down", depth)
		if err != nil || res[0] != depth {
			t.Fatalf("down(%d) = %v, %v", depth, res, err)
		}
		if got := m.stack.Get(); got != frame {
			t.Errorf("after down(%d): %s = %d, want the outermost frame %d", depth, StackGlobal, got, frame)
		}
	}
	m.stack.Set(0)
	if _, err := m.call(t, "down", 1000); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("down(1000) past the room: %v, want a trap", err)
	}
	if got := m.stack.Get(); got != StackOverflow {
		t.Errorf("after the trap: %s = %d, want StackOverflow", StackGlobal, got)
	}
}

// TestMeterOperands: values held on the operand stack across a call are
// charged like locals.
func TestMeterOperands(t *testing.T) {
	src := `(module (global $s (mut i64) (i64.const 0))
  (func $f (export "f") (result i64) (local $v i64)
    ` + strings.Repeat("(i64.add (local.get $v) (global.get $s))\n", 1000) + `
    (call $f)
    ` + strings.Repeat("i64.add\n", 1000) + `)
  (func (export "simd") (result v128)
    ` + strings.Repeat("(i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 (v128.const i64x2 0 0) (v128.const i64x2 0 0))\n", 100) + `
    ` + strings.Repeat("i8x16.eq\n", 99) + `
    ` + strings.Repeat("(v128.store (i32.const 0) (v128.load offset=16 (i32.const 0)))\n", 10) + `)
  (memory 1))`
	_, info, err := Meter(wat(t, src), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if want := FrameBytes(1+1001, 1); info.MaxFrameBytes < want {
		t.Errorf("a function holding 1,001 operands and a local is charged %d bytes, want at least %d", info.MaxFrameBytes, want)
	}
	if info.MaxFrameBytes > FrameBytes(1+1001+8, 1) {
		t.Errorf("charged %d bytes: more than its operands", info.MaxFrameBytes)
	}
}

const grower = `(module
  (table $t 1 funcref)
  (table $e 0 externref)
  (func $f)
  (elem declare func $f)
  (func (export "grow") (param $n i32) (result i32)
    (table.grow $t (ref.func $f) (local.get $n)))
  (func (export "grow_extern") (param $n i32) (result i32)
    (table.grow $e (ref.null extern) (local.get $n)))
  (func (export "size") (result i32) (table.size $t))
  (func (export "filled") (param $i i32) (result i32)
    (ref.is_null (table.get $t (local.get $i)))))`

func TestMeterTableGrow(t *testing.T) {
	r := newRuntime(t)
	m := instantiateMetered(t, r, wat(t, grower), wazero.NewModuleConfig())
	const room = 1000 * TableEntryBytes
	m.room.Set(room)
	call := func(name string, args ...uint64) uint64 {
		t.Helper()
		m.stack.Set(0)
		res, err := m.call(t, name, args...)
		if err != nil {
			t.Fatalf("%s%v: %v", name, args, err)
		}
		return res[0]
	}
	if old := call("grow", 100); old != 1 {
		t.Errorf("grow(100) = %d, want the old size 1", old)
	}
	if got := m.room.Get(); got != room-100*TableEntryBytes {
		t.Errorf("room after growing by 100: %d, want %d", got, room-100*TableEntryBytes)
	}
	if call("filled", 100) != 0 {
		t.Error("the grown entries do not hold the initial value")
	}
	if old := call("grow", 1000); old != api.EncodeI32(-1) {
		t.Errorf("grow(1000) past the room = %d, want -1", int32(old))
	}
	if size := call("size"); size != 101 {
		t.Errorf("size after a refused grow = %d, want 101", size)
	}
	if old := call("grow_extern", 800); old != 0 {
		t.Errorf("grow_extern(800) = %d, want 0", int32(old))
	}
	if got := m.room.Get(); got != room-900*TableEntryBytes {
		t.Errorf("room = %d, want %d", got, room-900*TableEntryBytes)
	}
	if old := call("grow", 1<<26); old != api.EncodeI32(-1) {
		t.Errorf("grow(1<<26) = %d, want -1", int32(old))
	}
}

// TestMeterRefusesOwnIndices: code naming the locals or globals Meter adds
// is refused, although only the rewrite would make it valid.
func TestMeterRefusesOwnIndices(t *testing.T) {
	for name, body := range map[string][]byte{
		"global.set": {0x42, 0, 0x24, 0, 0x0b}, // the module has no global: 0 would be the stack's
		"global.get": {0x23, 1, 0x1a, 0x0b},
		"local.set":  {0x42, 0, 0x21, 0, 0x0b}, // no locals: 0 would be mine
	} {
		t.Run(name, func(t *testing.T) {
			b := module(nil, []fn{{body: body}})
			if _, _, err := Meter(b, DefaultLimits); !errors.Is(err, ErrMalformed) {
				t.Errorf("Meter = %v, want ErrMalformed", err)
			}
			if _, err := newRuntime(t).CompileModule(context.Background(), b); err == nil {
				t.Error("wazero accepts the original")
			}
		})
	}
}

func TestMeterLimits(t *testing.T) {
	lim := DefaultLimits
	for _, tt := range []struct {
		name string
		mod  []byte
		what string
	}{
		{"locals in a function", module(nil, []fn{{locals: 4_000_000_000}}), "locals in function 0"},
		{"locals in all functions", module(nil, repeat(fn{locals: 50_000}, 100)), "locals in all functions"},
		{"table minimum", module([]sec{{secTable, []byte{1, refFunc, 0, 0x80, 0x80, 0x80, 0x40}}}, nil), "table entries"},
		{"tables", module([]sec{{secTable, append(appendU32(nil, 1001), bytes.Repeat([]byte{refFunc, 0, 0}, 1001)...)}}, nil), "tables"},
		{"globals", module([]sec{{secGlobal, append(appendU32(nil, 100_001), bytes.Repeat([]byte{0x7f, 1, 0x41, 0, 0x0b}, 100_001)...)}}, nil), "globals"},
		{"element entries", module([]sec{
			{secTable, []byte{1, refFunc, 0, 1}},
			{secElement, append(append([]byte{1, 1, 0}, appendU32(nil, 1_000_001)...), make([]byte, 1_000_001)...)},
		}, []fn{{}}), "element segment entries"},
		{"parameters", module([]sec{{secType, append(append([]byte{1, 0x60}, appendU32(nil, 1001)...), append(bytes.Repeat([]byte{0x7f}, 1001), 0)...)}}, nil), "parameters"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Meter(tt.mod, lim)
			var le *LimitError
			if !errors.As(err, &le) || !strings.Contains(le.What, tt.what) {
				t.Errorf("Meter = %v, want a LimitError on %q", err, tt.what)
			}
		})
	}
}

func TestMeterMalformedAndUnsupported(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  []byte
		want error
	}{
		{"header", []byte("\x00asm\x02\x00\x00\x00"), ErrMalformed},
		{"section overrun", append(append([]byte(nil), header...), 1, 10, 0), ErrMalformed},
		{"huge count", append(append([]byte(nil), header...), 1, 5, 0xff, 0xff, 0xff, 0xff, 0x0f), ErrMalformed},
		{"no end", module(nil, []fn{{body: []byte{0x01}}}), ErrMalformed},
		{"tail call", module(nil, []fn{{body: []byte{0x12, 0, 0x0b}}}), ErrUnsupported},
		{"atomics", module(nil, []fn{{body: []byte{0xfe, 0, 0x0b}}}), ErrUnsupported},
		{"reserved export", module([]sec{{secExport, append(append([]byte{1}, name(nil, StackGlobal)...), 0, 0)}}, []fn{{}}), ErrUnsupported},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := Meter(tt.mod, DefaultLimits); !errors.Is(err, tt.want) {
				t.Errorf("Meter = %v, want %v", err, tt.want)
			}
		})
	}
}

// sec is a hand-built section; fn a function of type () -> () with
// locals i64 locals and body (default: just end).
type sec struct {
	id      byte
	payload []byte
}

type fn struct {
	locals uint32
	body   []byte
}

func repeat(f fn, n int) []fn {
	out := make([]fn, n)
	for i := range out {
		out[i] = f
	}
	return out
}

// module assembles a module: a type () -> () unless secs has a type
// section, then secs in order (type, table, global, export, element go
// where the format wants them), then the functions.
func module(secs []sec, fns []fn) []byte {
	out := append([]byte(nil), header...)
	typ := []byte{1, 0x60, 0, 0}
	for _, s := range secs {
		if s.id == secType {
			typ = s.payload
		}
	}
	out = append(out, section(secType, typ)...)
	if len(fns) > 0 {
		fs := appendU32(nil, uint32(len(fns)))
		out = append(out, section(secFunction, append(fs, make([]byte, len(fns))...))...)
	}
	for _, s := range secs {
		if s.id != secType && s.id != secElement {
			out = append(out, section(s.id, s.payload)...)
		}
	}
	for _, s := range secs {
		if s.id == secElement {
			out = append(out, section(s.id, s.payload)...)
		}
	}
	if len(fns) > 0 {
		code := appendU32(nil, uint32(len(fns)))
		for _, f := range fns {
			var body []byte
			if f.locals > 0 {
				body = append(appendU32([]byte{1}, f.locals), 0x7e)
			} else {
				body = []byte{0}
			}
			if f.body == nil {
				body = append(body, 0x0b)
			} else {
				body = append(body, f.body...)
			}
			code = append(appendU32(code, uint32(len(body))), body...)
		}
		out = append(out, section(secCode, code)...)
	}
	return out
}

// FuzzMeter: Meter never panics, never makes a module wazero refuses
// valid (which would let code reach the globals it adds), and keeps valid
// modules valid.
func FuzzMeter(f *testing.F) {
	for _, src := range []string{"echo", "trap", "loop"} {
		f.Add(tiny.Bytes(src))
	}
	f.Add(module(nil, []fn{{body: []byte{0x10, 0, 0x0b}}}))
	f.Add(module([]sec{{secTable, []byte{1, refFunc, 0, 1}}}, []fn{{body: []byte{0xd0, refFunc, 0x41, 1, 0xfc, 15, 0, 0x1a, 0x0b}}}))
	r := wazero.NewRuntime(context.Background())
	f.Cleanup(func() { r.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, b []byte) {
		out, _, err := Meter(b, DefaultLimits)
		if err != nil {
			return
		}
		cm, err := r.CompileModule(context.Background(), out)
		origValid := func() bool {
			c, err := r.CompileModule(context.Background(), b)
			if err == nil {
				c.Close(context.Background())
			}
			return err == nil
		}
		if err == nil {
			cm.Close(context.Background())
			if !origValid() {
				t.Fatalf("Meter made an invalid module valid")
			}
		} else if origValid() {
			t.Fatalf("Meter made a valid module invalid: %v", err)
		}
	})
}
