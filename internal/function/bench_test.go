package function

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

func benchSandbox(b *testing.B) sandbox.Sandbox {
	b.Helper()
	rt := newRuntime(b, b.TempDir(), Options{})
	sb, err := rt.Create(context.Background(), sandbox.Spec{ID: "bench", Tier: Tier, Image: testImage(b), MemoryMB: 256, DiskMB: 16})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Destroy(context.Background()) })
	return sb
}

func benchCalls(b *testing.B, req api.ExecRequest, want string) {
	sb := benchSandbox(b)
	ctx := context.Background()
	for i := 0; i < 20; i++ { // compile and fill the pool
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: req}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: req})
			if err != nil || res.Stdout != want {
				b.Errorf("Exec = %+v, %v", res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkCallTiny runs the hand-written echo module through Sandbox.Exec.
func BenchmarkCallTiny(b *testing.B) {
	benchCalls(b, api.ExecRequest{Cmd: []string{"tiny-echo"}, Stdin: "hello\n"}, "hello\n")
}

// BenchmarkCallGoTool runs echo from the Go-compiled dsectools.
func BenchmarkCallGoTool(b *testing.B) {
	benchCalls(b, api.ExecRequest{Cmd: []string{"echo", "hello"}}, "hello\n")
}

// BenchmarkIdleSandboxMemory creates 500 sandboxes and reports the growth
// of the process's resident memory and Go heap per sandbox.
func BenchmarkIdleSandboxMemory(b *testing.B) {
	const n = 500
	rt := newRuntime(b, b.TempDir(), Options{})
	img := testImage(b)
	ctx := context.Background()
	var rssPer, heapPer float64
	for i := 0; i < b.N; i++ {
		runtime.GC()
		rss0, heap0 := vmRSS(b), heapAlloc()
		sbs := make([]sandbox.Sandbox, 0, n)
		for j := 0; j < n; j++ {
			sb, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("idle-%d-%d", i, j), Tier: Tier, Image: img, MemoryMB: 256, DiskMB: 16})
			if err != nil {
				b.Fatal(err)
			}
			sbs = append(sbs, sb)
		}
		runtime.GC()
		rssPer += float64(vmRSS(b)-rss0) / n
		heapPer += float64(heapAlloc()-heap0) / n
		b.StopTimer()
		for _, sb := range sbs {
			if err := sb.Destroy(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(rssPer/float64(b.N), "rss-bytes/sandbox")
	b.ReportMetric(heapPer/float64(b.N), "heap-bytes/sandbox")
}

func heapAlloc() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// vmRSS returns the process's resident set size from /proc/self/status.
func vmRSS(tb testing.TB) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// BenchmarkCreateExecDelete creates a sandbox, runs tiny-echo in it and
// destroys it, in-process (dsec bench's create-exec-delete without the
// API).
func BenchmarkCreateExecDelete(b *testing.B) {
	rt := newRuntime(b, b.TempDir(), Options{})
	img := testImage(b)
	ctx := context.Background()
	req := sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"tiny-echo"}, Stdin: "ping"}}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			sb, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("cycle-%d", n.Add(1)), Tier: Tier, Image: img, MemoryMB: 256, DiskMB: 16})
			if err != nil {
				b.Error(err)
				return
			}
			res, err := sb.Exec(ctx, req)
			if err != nil || res.Stdout != "ping" {
				b.Errorf("Exec = %+v, %v", res, err)
			}
			if err := sb.Destroy(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
