//go:build linux

package cgroups

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkCreateAddDestroy measures a sandbox's cgroup life: Create with
// limits, AddProc of a (long-lived) process, and Destroy. To keep process
// start-up out of the figure, the same sleeping process is moved back to
// the parent before each Destroy (a sandbox's processes would be killed
// instead; Kill of an empty group is measured).
func BenchmarkCreateAddDestroy(b *testing.B) {
	m := newManager(b, Options{})
	p := start(b, nil, "sleep", "600")
	pid := strconv.Itoa(p.cmd.Process.Pid)
	l := Limits{CPU: 1, MemoryBytes: 256 << 20, Pids: 256}
	var create, add, destroy time.Duration
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		g, err := m.Create(ctx, fmt.Sprintf("b%d", i), l)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := g.AddProc(p.cmd.Process.Pid); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		for _, mnt := range m.mounts() {
			if err := writeFile(filepath.Join(mnt, m.parent, "cgroup.procs"), pid); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		if err := g.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		create += t1.Sub(t0)
		add += t2.Sub(t1)
		destroy += t4.Sub(t3)
	}
	n := float64(b.N)
	b.ReportMetric(float64(create.Microseconds())/n, "create-µs/op")
	b.ReportMetric(float64(add.Microseconds())/n, "addproc-µs/op")
	b.ReportMetric(float64(destroy.Microseconds())/n, "destroy-µs/op")
}
