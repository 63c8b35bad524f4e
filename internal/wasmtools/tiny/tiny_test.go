package tiny

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGenerated recompiles each .wat source and compares the result with
// the committed .wasm file.
func TestGenerated(t *testing.T) {
	wat2wasm, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skipf("could not find wat2wasm (Debian package wabt): %v", err)
	}
	for _, src := range Modules {
		t.Run(src, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), src+".wasm")
			cmd := exec.Command(wat2wasm, src+".wat", "-o", out)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("wat2wasm %s.wat: %v\n%s", src, err, b)
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if got := Bytes(src); !bytes.Equal(got, want) {
				t.Errorf("%s.wasm is stale: run go generate in internal/wasmtools/tiny", src)
			}
		})
	}
}

func TestBytes(t *testing.T) {
	for name, src := range Modules {
		b := Bytes(src)
		if len(b) < 8 || !bytes.Equal(b[:4], []byte("\x00asm")) {
			t.Errorf("%s (%s): not a wasm module", name, src)
		}
	}
	if Bytes("nope") != nil {
		t.Errorf("Bytes(unknown) != nil")
	}
}
