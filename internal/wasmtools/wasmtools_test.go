package wasmtools

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
)

func TestForTest(t *testing.T) {
	root := ForTest(t)
	echo, err := os.ReadFile(filepath.Join(root, "bin", "echo.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(echo, []byte("\x00asm")) {
		t.Fatalf("echo.wasm is not a wasm module")
	}
	for _, name := range Tools {
		b, err := os.ReadFile(filepath.Join(root, "bin", name+".wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, echo) {
			t.Errorf("%s.wasm differs from echo.wasm; every tool must be the same module", name)
		}
	}
	for name, src := range tiny.Modules {
		b, err := os.ReadFile(filepath.Join(root, "bin", name+".wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, tiny.Bytes(src)) {
			t.Errorf("%s.wasm differs from tiny %s", name, src)
		}
	}
	if got := ForTest(t); got != root {
		t.Errorf("second ForTest = %s, want %s", got, root)
	}
}
