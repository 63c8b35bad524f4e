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

// TestWasmToolsLayer checks that the layer holds what InstallFunctionImage
// installs.
func TestWasmToolsLayer(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	dir := fill(t, spec(t, WasmTools))
	data := t.TempDir()
	installed, _, err := InstallFunctionImage(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	entries := walk(t, dir)
	names := append(append([]string(nil), wasmtools.Tools...), wasmtools.TinyTools...)
	sort.Strings(names)
	if len(entries) != len(names)+1 || entries["bin"] != (entry{mode: os.ModeDir | 0o755}) {
		t.Errorf("tree %+v", entries)
	}
	for _, n := range names {
		p := "bin/" + n + ".wasm"
		if e := entries[p]; e != (entry{mode: 0o644}) {
			t.Errorf("%s: %+v", p, e)
		}
		got, _ := os.ReadFile(filepath.Join(dir, p))
		want, err := os.ReadFile(filepath.Join(installed, p))
		if err != nil || !bytes.Equal(got, want) || !bytes.HasPrefix(got, []byte("\x00asm")) {
			t.Errorf("%s: %d bytes, InstallFunctionImage's %d (%v)", p, len(got), len(want), err)
		}
	}
}
