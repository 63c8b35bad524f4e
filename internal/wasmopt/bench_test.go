package wasmopt

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/dsec-dev/dsec/internal/wasmtools"
)

// BenchmarkInstantiateGoTool instantiates a Go-compiled tool (no start
// function) as built and after MergeData, in the same run, so the ratio
// between the two is what to read.
func BenchmarkInstantiateGoTool(b *testing.B) {
	orig, err := os.ReadFile(filepath.Join(wasmtools.ForTest(b), "bin", "echo.wasm"))
	if err != nil {
		b.Fatal(err)
	}
	merged, err := MergeData(orig)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		mod  []byte
	}{{"original", orig}, {"merged", merged}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			r := wazero.NewRuntime(ctx) // the compiler, as the function tier uses
			defer r.Close(ctx)
			if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
				b.Fatal(err)
			}
			cm, err := r.CompileModule(ctx, bc.mod)
			if err != nil {
				b.Fatal(err)
			}
			cfg := wazero.NewModuleConfig().WithStartFunctions().WithName("")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m, err := r.InstantiateModule(ctx, cm, cfg)
				if err != nil {
					b.Fatal(err)
				}
				m.Close(ctx)
			}
		})
	}
}
