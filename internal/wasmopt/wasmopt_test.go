package wasmopt

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/wasmtools"
	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
	"github.com/google/go-cmp/cmp"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// seg is an active data segment for hand-built modules.
type seg struct {
	off  int32
	data string
}

// mod describes a hand-built module: a memory (defined or imported) and a
// data section.
type mod struct {
	importMem bool
	pages     uint32
	segs      []seg
	passive   []string // passive segments, after the active ones
	dataCount bool
}

func section(id byte, payload []byte) []byte {
	return append(appendU32([]byte{id}, uint32(len(payload))), payload...)
}

func (m mod) bytes() []byte {
	out := append([]byte(nil), header...)
	if m.importMem {
		imp := appendU32(nil, 1)
		imp = name(imp, "env")
		imp = name(imp, "mem")
		imp = append(imp, 2, 0) // memory, limits without max
		imp = appendU32(imp, m.pages)
		out = append(out, section(secImport, imp)...)
	} else {
		mem := appendU32(nil, 1)
		mem = append(mem, 0)
		mem = appendU32(mem, m.pages)
		out = append(out, section(5, mem)...)
	}
	n := len(m.segs) + len(m.passive)
	if m.dataCount {
		out = append(out, section(secDataCount, appendU32(nil, uint32(n)))...)
	}
	data := appendU32(nil, uint32(n))
	for _, s := range m.segs {
		data = append(data, 0, 0x41)
		data = appendS32(data, s.off)
		data = append(data, 0x0b)
		data = appendU32(data, uint32(len(s.data)))
		data = append(data, s.data...)
	}
	for _, p := range m.passive {
		data = append(data, 1)
		data = appendU32(data, uint32(len(p)))
		data = append(data, p...)
	}
	return append(out, section(secData, data)...)
}

// dataSegments returns the active segments of a module's data section.
func dataSegments(t *testing.T, b []byte) []segment {
	t.Helper()
	p := len(header)
	for p < len(b) {
		id := b[p]
		size, n, err := readU32(b[p+1:])
		if err != nil {
			t.Fatal(err)
		}
		start := p + 1 + n
		if id == secData {
			segs, ok, err := parseData(b[start : start+int(size)])
			if err != nil || !ok {
				t.Fatalf("parseData: ok=%v err=%v", ok, err)
			}
			return segs
		}
		p = start + int(size)
	}
	return nil
}

// newRuntime returns an interpreter runtime (cheap to compile into) with
// WASI, memories capped at 16 MiB, closed with the test.
func newRuntime(t testing.TB) wazero.Runtime {
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter().
		WithMemoryLimitPages(1024).WithCloseOnContextDone(true))
	t.Cleanup(func() { r.Close(ctx) })
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		t.Fatal(err)
	}
	return r
}

// initialMemory instantiates b without running _start and returns a copy of
// its memory, or the error of compiling or instantiating it.
func initialMemory(r wazero.Runtime, b []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cm, err := r.CompileModule(ctx, b)
	if err != nil {
		return nil, err
	}
	defer cm.Close(ctx)
	m, err := r.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithStartFunctions().WithName(""))
	if err != nil {
		return nil, err
	}
	defer m.Close(ctx)
	mem := m.Memory()
	if mem == nil {
		return nil, nil
	}
	buf, ok := mem.Read(0, mem.Size())
	if !ok {
		return nil, errors.New("reading memory")
	}
	return bytes.Clone(buf), nil
}

func TestMergeDataGoModule(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join(wasmtools.ForTest(t), "bin", "echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := MergeData(orig)
	if err != nil {
		t.Fatal(err)
	}
	before, after := len(dataSegments(t, orig)), len(dataSegments(t, merged))
	t.Logf("data segments: %d → %d; module size %d → %d bytes", before, after, len(orig), len(merged))
	if after >= before || after > before/10 {
		t.Errorf("merging left %d of %d segments", after, before)
	}
	r := newRuntime(t)
	want, err := initialMemory(r, orig)
	if err != nil {
		t.Fatal(err)
	}
	got, err := initialMemory(r, merged)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("initial memory differs after merging (%d vs %d bytes)", len(got), len(want))
	}
}

func TestMergeData(t *testing.T) {
	tests := []struct {
		name      string
		in        mod
		unchanged bool
		want      []segment // when changed
	}{
		{
			name: "adjacent and gapped merge",
			in:   mod{pages: 1, segs: []seg{{0, "ab"}, {2, "cd"}, {10, "ef"}}},
			want: []segment{{0, []byte("abcd\x00\x00\x00\x00\x00\x00ef")}},
		},
		{
			name: "unsorted input merges in offset order",
			in:   mod{pages: 1, segs: []seg{{100, "z"}, {10, "a"}, {20, "b"}}},
			want: []segment{{10, []byte("a" + string(make([]byte, 9)) + "b" + string(make([]byte, 79)) + "z")}},
		},
		{
			name: "gap past the limit stays split",
			in:   mod{pages: 1, segs: []seg{{0, "a"}, {1, "b"}, {2 + maxGap + 1, "c"}}},
			want: []segment{{0, []byte("ab")}, {2 + maxGap + 1, []byte("c")}},
		},
		{
			name: "gap exactly at the limit merges",
			in:   mod{pages: 1, segs: []seg{{0, "a"}, {1 + maxGap, "b"}}},
			want: []segment{{0, []byte("a" + string(make([]byte, maxGap)) + "b")}},
		},
		{name: "imported memory", in: mod{importMem: true, pages: 1, segs: []seg{{0, "a"}, {1, "b"}}}, unchanged: true},
		{name: "passive segment", in: mod{pages: 1, segs: []seg{{0, "a"}, {1, "b"}}, passive: []string{"p"}}, unchanged: true},
		{name: "data count section", in: mod{pages: 1, segs: []seg{{0, "a"}, {1, "b"}}, dataCount: true}, unchanged: true},
		{name: "overlapping", in: mod{pages: 1, segs: []seg{{0, "abc"}, {1, "x"}}}, unchanged: true},
		{name: "negative offset", in: mod{pages: 1, segs: []seg{{-1, "a"}, {1, "b"}}}, unchanged: true},
		{name: "nothing to merge", in: mod{pages: 1, segs: []seg{{0, "a"}}}, unchanged: true},
		{name: "no data", in: mod{pages: 1}, unchanged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in.bytes()
			out, err := MergeData(in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.unchanged {
				if !bytes.Equal(out, in) {
					t.Fatalf("module changed")
				}
				return
			}
			if diff := cmp.Diff(tt.want, dataSegments(t, out), cmp.AllowUnexported(segment{})); diff != "" {
				t.Errorf("segments (-want +got):\n%s", diff)
			}
			r := newRuntime(t)
			want, err := initialMemory(r, in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := initialMemory(r, out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("initial memory differs")
			}
		})
	}
}

func TestMergeDataMalformed(t *testing.T) {
	good := mod{pages: 1, segs: []seg{{0, "a"}, {1, "b"}}}.bytes()
	for _, tt := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"bad magic", []byte("\x00asn\x01\x00\x00\x00")},
		{"truncated section", good[:len(good)-1]},
		{"section overruns", append(append([]byte(nil), header...), 11, 0x7f)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := MergeData(tt.in); !errors.Is(err, ErrMalformed) {
				t.Errorf("err = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestMergeDataDoesNotModifyInput(t *testing.T) {
	in := mod{pages: 1, segs: []seg{{0, "ab"}, {4, "cd"}}}.bytes()
	keep := bytes.Clone(in)
	if _, err := MergeData(in); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, keep) {
		t.Errorf("MergeData modified its input")
	}
}

func FuzzMergeData(f *testing.F) {
	f.Add(mod{pages: 1, segs: []seg{{0, "ab"}, {2, "cd"}, {10, "ef"}}}.bytes())
	f.Add(mod{pages: 1, segs: []seg{{0, "a"}, {1, "b"}, {2 + maxGap + 1, "c"}}}.bytes())
	f.Add(mod{pages: 1, segs: []seg{{0, "abc"}, {1, "x"}}}.bytes())
	f.Add(mod{pages: 1, segs: []seg{{65530, "abcdefgh"}, {3, "x"}}}.bytes())
	f.Add(mod{importMem: true, pages: 1, segs: []seg{{0, "a"}, {1, "b"}}}.bytes())
	f.Add(mod{pages: 1, segs: []seg{{0, "a"}, {1, "b"}}, passive: []string{"p"}}.bytes())
	f.Add(tiny.Bytes("echo"))
	r := newRuntime(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := MergeData(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if bytes.Equal(out, in) {
			return
		}
		want, errIn := initialMemory(r, in)
		got, errOut := initialMemory(r, out)
		if (errIn == nil) != (errOut == nil) {
			t.Fatalf("original: %v; merged: %v", errIn, errOut)
		}
		if errIn == nil && !bytes.Equal(got, want) {
			t.Fatalf("initial memory differs")
		}
	})
}
