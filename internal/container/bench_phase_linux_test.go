package container

import (
	"context"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// BenchmarkPhaseChange is a phase change of a running sandbox with two
// background processes of the earlier phase to end (freeze, kill, the
// new phase's mounts and limits, thaw), alternating between a phase with
// one writable path and one with the whole root writable; then the first
// command of the new phase.
func BenchmarkPhaseChange(b *testing.B) {
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	rt := newRuntime(b, dir, runtimeOptions{pool: 2})
	ctx := context.Background()
	phases := []api.Phase{{Name: "setup"}, {Name: "coding", Writable: []string{"/tmp"}, User: "1000"}}
	sb, err := rt.Create(ctx, sandbox.Spec{ID: "phases", Image: world.image(), Phases: phases})
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Destroy(ctx)
	s := sb.(*Sandbox)
	spawn := sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh("(sleep 600 &) ; (sleep 600 &)")}}
	var change, first []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := s.Exec(ctx, spawn); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := s.SetPhase(ctx, phases[(i+1)%2]); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := s.Exec(ctx, trueCmd); err != nil {
			b.Fatal(err)
		}
		change, first = append(change, t1.Sub(t0)), append(first, time.Since(t1))
	}
	b.StopTimer()
	b.ReportMetric(pct(change, 50), "change-p50-ms")
	b.ReportMetric(pct(change, 99), "change-p99-ms")
	b.ReportMetric(pct(first, 50), "first-exec-p50-ms")
}
