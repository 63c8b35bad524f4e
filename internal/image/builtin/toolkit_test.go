package builtin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/wasmtools"
	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
)

func TestGuestLayer(t *testing.T) {
	needRoot(t)
	s := spec(t, Guest)
	entries := walk(t, fill(t, s))
	want := map[string]entry{
		"opt":                     {mode: 0o755 | os.ModeDir},
		"opt/dsec":                {mode: 0o755 | os.ModeDir},
		"opt/dsec/bin":            {mode: 0o755 | os.ModeDir},
		"opt/dsec/bin/dsec-guest": {mode: 0o755},
	}
	if len(entries) != len(want) {
		t.Errorf("tree %+v, want %+v", entries, want)
	}
	for name, w := range want {
		if got := entries[name]; got != w {
			t.Errorf("%s: %+v, want %+v", name, got, w)
		}
	}
	art, err := Ensure(context.Background(), t.TempDir(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(mount(t, art), GuestPath)
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "dsec-guest ") {
		t.Errorf("dsec-guest version: %q, %v", out, err)
	}
	err = exec.Command(bin, "init", "--", "/bin/sh", "-c", "exit 3").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("dsec-guest init -- sh -c 'exit 3': %v, want exit status 3", err)
	}
}

// TestWasmToolsLayer checks the tools' tree: every tool name is the
// dsectools program, and the tiny modules are the committed ones.
func TestWasmToolsLayer(t *testing.T) {
	needRoot(t)
	dir := fill(t, spec(t, WasmTools))
	entries := walk(t, dir)
	names := append(append([]string(nil), wasmtools.Tools...), wasmtools.TinyTools...)
	sort.Strings(names)
	if len(entries) != len(names)+1 || entries["bin"] != (entry{mode: os.ModeDir | 0o755}) {
		t.Errorf("tree %+v", entries)
	}
	prog, err := toolsProgram()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		p := "bin/" + n + ".wasm"
		if e := entries[p]; e != (entry{mode: 0o644}) {
			t.Errorf("%s: %+v", p, e)
		}
		got, _ := os.ReadFile(filepath.Join(dir, p))
		want := prog
		if src, ok := tiny.Modules[n]; ok {
			want = tiny.Bytes(src)
		}
		if !bytes.Equal(got, want) || !bytes.HasPrefix(got, []byte("\x00asm")) {
			t.Errorf("%s: %d bytes, want %d", p, len(got), len(want))
		}
	}
}
