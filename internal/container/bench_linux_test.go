package container

import (
	"context"
	"fmt"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// BenchmarkCycle is create → first command done → destroy, one at a time.
func BenchmarkCycle(b *testing.B) {
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	rt := newRuntime(b, dir, runtimeOptions{pool: 32})
	img := world.image()
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sb, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("bench-%d", i), Image: img, MemoryMB: 256, DiskMB: 64})
		if err != nil {
			b.Fatal(err)
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}})
		if err != nil || res.ExitCode != 0 {
			b.Fatal(err, res)
		}
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
