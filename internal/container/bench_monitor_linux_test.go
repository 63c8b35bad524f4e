package container

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/audit"
	"github.com/dsec-dev/dsec/internal/monitor"
)

// countSink counts audit events (the benchmark measures the monitor, not
// JetStream).
type countSink struct{ n *atomic.Int64 }

func (s countSink) Append(context.Context, api.AuditEvent) error { s.n.Add(1); return nil }

// BenchmarkMonitor is the eBPF monitor's overhead: create → `true` →
// destroy cycles (8 at a time) and exec round trips (one at a time) of
// runtimes with and without the monitor, in alternating blocks of one
// process. Each b.N is a round of one block of each.
func BenchmarkMonitor(b *testing.B) {
	mon, err := monitor.Start(nil)
	if err != nil {
		b.Fatalf("the monitor: %v", err)
	}
	var events atomic.Int64
	rules, err := audit.LoadRules("")
	if err != nil {
		b.Fatal(err)
	}
	rec := audit.NewRecorder(mon, rules, countSink{&events}, nil)
	// bounded: closing the monitor ends the recorder's loop
	b.Cleanup(func() { mon.Close(); rec.Wait() }) // after the runtimes'
	offDir, onDir := b.TempDir(), b.TempDir()
	b.Cleanup(func() { checkHost(b, offDir); checkHost(b, onDir) })
	rts := map[string]*testRuntime{
		"off": newRuntime(b, offDir, runtimeOptions{pool: 2}),
		"on":  newRuntime(b, onDir, runtimeOptions{pool: 2, monitor: rec}),
	}
	ctx := context.Background()
	execSB := map[string]*Sandbox{}
	for name, rt := range rts {
		sb, err := rt.Create(ctx, benchSpec("exec-"+name))
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Destroy(ctx)
		execSB[name] = sb.(*Sandbox)
	}
	type result struct {
		cycles    int
		cycleWall time.Duration
		execs     []time.Duration
	}
	res := map[string]*result{"off": {}, "on": {}}
	var seq atomic.Int64
	block := func(name string, record bool) {
		rt, sb := rts[name], execSB[name]
		ss, wall, err := parallel(64, 8, func(int) (cycleSample, error) {
			return cycleOnce(ctx, rt, fmt.Sprintf("m%d", seq.Add(1)))
		})
		if err != nil {
			b.Fatal(err)
		}
		lat, _, err := parallel(200, 1, func(int) (time.Duration, error) {
			t := time.Now()
			_, err := sb.Exec(ctx, trueCmd)
			return time.Since(t), err
		})
		if err != nil {
			b.Fatal(err)
		}
		if record {
			r := res[name]
			r.cycles += len(ss)
			r.cycleWall += wall
			r.execs = append(r.execs, lat...)
		}
	}
	block("off", false)
	block("on", false)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		order := []string{"off", "on"}
		if i%2 == 1 {
			order = []string{"on", "off"}
		}
		for _, name := range order {
			block(name, true)
		}
	}
	b.StopTimer()
	off, on := res["off"], res["on"]
	if off.cycles == 0 {
		return
	}
	offRate := float64(off.cycles) / off.cycleWall.Seconds()
	onRate := float64(on.cycles) / on.cycleWall.Seconds()
	b.ReportMetric(offRate, "off-cycles/s")
	b.ReportMetric(onRate, "on-cycles/s")
	b.ReportMetric(pct(off.execs, 50), "off-exec-p50-ms")
	b.ReportMetric(pct(on.execs, 50), "on-exec-p50-ms")
	b.ReportMetric(100*(offRate-onRate)/offRate, "create-rate-overhead-%")
	b.ReportMetric(100*(pct(on.execs, 50)-pct(off.execs, 50))/pct(off.execs, 50), "exec-p50-overhead-%")
	b.ReportMetric(float64(events.Load())/float64(on.cycles+len(on.execs)), "events/op")
	b.ReportMetric(float64(mon.Dropped()), "dropped")
}
