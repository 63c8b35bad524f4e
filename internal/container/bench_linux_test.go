package container

// Benchmarks of the container tier (figures and how they were
// taken: docs/bench.md). They need root, like the tier. `make bench` runs
// them; `go test` skips benchmarks, so none of this slows the tests, and
// no test asserts a timing.
//
//	BenchmarkCycle    create → first command done → destroy, DSec alone
//	                  (seq, par8); the one to profile
//	BenchmarkVsOCI    the same cycle against `crun run` and `runc run` of
//	                  the same root, interleaved (bench_oci_linux_test.go)
//	BenchmarkExec     a command's round trip in a running sandbox
//	BenchmarkDensity  thousands of idle sandboxes (bench_density_linux_test.go)
//	BenchmarkCreatePhases  where a create's time goes (bench_phases_linux_test.go)

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// benchSpec is the sandbox every benchmark creates: the busybox image,
// networking on (a namespace with its veth, default-deny egress), 256 MiB
// of memory, a 64 MiB upper.
func benchSpec(id string) sandbox.Spec {
	return sandbox.Spec{ID: id, Image: world.image(), MemoryMB: 256, DiskMB: 64}
}

// cycleSample is one create → first command done → destroy.
type cycleSample struct {
	ready   time.Duration // Create returned: the agent answered Hello
	exec    time.Duration // `true` ran and its result came back
	destroy time.Duration
	total   time.Duration
}

var trueCmd = sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}

func cycleOnce(ctx context.Context, rt *testRuntime, id string) (cycleSample, error) {
	spec := benchSpec(id)
	spec.Network = rt.benchNet
	t0 := time.Now()
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		return cycleSample{}, err
	}
	t1 := time.Now()
	res, err := sb.Exec(ctx, trueCmd)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited with %d", res.ExitCode)
	}
	t2 := time.Now()
	if derr := sb.Destroy(ctx); err == nil {
		err = derr
	}
	t3 := time.Now()
	return cycleSample{ready: t1.Sub(t0), exec: t2.Sub(t1), destroy: t3.Sub(t2), total: t3.Sub(t0)}, err
}

// parallel calls fn(i) for i in [0, n) from conc goroutines and returns
// the samples, the wall time and the first error.
func parallel[S any](n, conc int, fn func(i int) (S, error)) ([]S, time.Duration, error) {
	var (
		next     atomic.Int64
		mu       sync.Mutex
		out      = make([]S, 0, n)
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				s, err := fn(i)
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					next.Store(int64(n)) // stop the others
				} else {
					out = append(out, s)
				}
				mu.Unlock()
			}
		}()
	}
	// bounded: every fn is a create, exec and destroy with their own timeouts
	wg.Wait()
	return out, time.Since(start), firstErr
}

// pct returns the p-th percentile (nearest rank) of ds, in milliseconds.
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i]) / float64(time.Millisecond)
}

func field(ss []cycleSample, f func(cycleSample) time.Duration) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func concName(conc int) string {
	if conc == 1 {
		return "seq"
	}
	return fmt.Sprintf("par%d", conc)
}

// BenchmarkCycle is create → first command (`true`) done → destroy, one
// at a time (seq) and from 8 goroutines (par8). ns/op is the wall time
// per sandbox, so par8's is the inverse of its rate.
func BenchmarkCycle(b *testing.B) {
	for _, mode := range []string{"", "warm-", "net-", "net-reuse-"} {
		for _, conc := range []int{1, 8} {
			b.Run(mode+concName(conc), func(b *testing.B) { benchCycle(b, conc, mode) })
		}
	}
}

// benchLinked is the policy of the benchmarks' sandboxes with a network
// of the node's: an allow-list (a veth pair, routes and nftables
// elements) the benchmark never uses.
var benchLinked = &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "203.0.113.7/32", Proto: "tcp", Ports: "9"}}}

// benchCycle is BenchmarkCycle's run of conc goroutines: sandboxes
// without network access (mode ""), with a network of the node's
// ("net-"), and with those namespaces reused ("net-reuse-"); "warm-" is
// mode "" with the warm pool of `dsec up` (2).
func benchCycle(b *testing.B, conc int, mode string) {
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	ro := runtimeOptions{pool: 32, reuse: mode == "net-reuse-"}
	if mode == "warm-" {
		ro.warm = 2
	}
	rt := newRuntime(b, dir, ro)
	if strings.HasPrefix(mode, "net-") {
		rt.benchNet = benchLinked
	}
	ctx := context.Background()
	if _, _, err := parallel(2*conc, conc, func(i int) (cycleSample, error) {
		return cycleOnce(ctx, rt, fmt.Sprintf("prime-%d", i))
	}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := cpuNow()
	ss, wall, err := parallel(b.N, conc, func(i int) (cycleSample, error) {
		return cycleOnce(ctx, rt, fmt.Sprintf("bench-%d", i))
	})
	cpu := cpuNow().sub(cpu0)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	reportCycles(b, "", ss, wall)
	n := float64(b.N)
	b.ReportMetric(cpu.self.Seconds()*1000/n, "node-cpu-ms/cycle")
	// The rest: agents, commands, the zygote and the kernel's own
	// threads (the agents are the zygote's children, not ours).
	b.ReportMetric((cpu.host-cpu.self).Seconds()*1000/n, "other-cpu-ms/cycle")
	b.ReportMetric(cpu.host.Seconds()*1000/n, "host-cpu-ms/cycle")
	if treeUsage() != "" {
		b.ReportMetric(cpu.tree.Seconds()*1000/n, "tree-cpu-ms/cycle")
	}
}

// cpuTimes are CPU times: this process's (the node side) and the whole
// host's (every process and kernel thread: the kernel's asynchronous
// teardown of namespaces too, but also whatever else the host runs).
type cpuTimes struct{ self, host, tree time.Duration }

// treeUsage is the cpuacct.usage file of this process's own cpuacct
// cgroup when it is not the root (a v1 cpuacct hierarchy DSec does not
// use): run the benchmark in a cgroup of its own and tree counts the
// CPU of the node, the zygote, the agents and their commands, without
// the rest of the host's load (but also without the kernel's threads).
var treeUsage = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "cpuacct") && f[2] != "/" {
			return "/sys/fs/cgroup/cpuacct" + f[2] + "/cpuacct.usage"
		}
	}
	return ""
})

func cpuNow() cpuTimes {
	var c cpuTimes
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if p := treeUsage(); p != "" {
		if b, err := os.ReadFile(p); err == nil {
			ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			c.tree = time.Duration(ns)
		}
	}
	// /proc/stat's first line: cpu user nice system idle iowait irq
	// softirq steal …, in USER_HZ (100) ticks.
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:min(len(f), 9)] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			t, _ := strconv.ParseInt(v, 10, 64)
			c.host += time.Duration(t) * 10 * time.Millisecond
		}
	}
	return c
}

func (c cpuTimes) sub(d cpuTimes) cpuTimes {
	return cpuTimes{c.self - d.self, c.host - d.host, c.tree - d.tree}
}

// reportCycles reports a set of cycles' percentiles and rate, each
// metric's unit prefixed with prefix.
func reportCycles(b *testing.B, prefix string, ss []cycleSample, wall time.Duration) {
	ready := field(ss, func(s cycleSample) time.Duration { return s.ready })
	total := field(ss, func(s cycleSample) time.Duration { return s.total })
	b.ReportMetric(pct(ready, 50), prefix+"ready-p50-ms")
	b.ReportMetric(pct(ready, 99), prefix+"ready-p99-ms")
	b.ReportMetric(pct(total, 50), prefix+"cycle-p50-ms")
	b.ReportMetric(pct(total, 99), prefix+"cycle-p99-ms")
	b.ReportMetric(pct(field(ss, func(s cycleSample) time.Duration { return s.exec }), 50), prefix+"exec-p50-ms")
	b.ReportMetric(pct(field(ss, func(s cycleSample) time.Duration { return s.destroy }), 50), prefix+"destroy-p50-ms")
	b.ReportMetric(float64(len(ss))/wall.Seconds(), prefix+"sandboxes/s")
}

// BenchmarkExec is the round trip of `true` in a running sandbox:
// request to the agent, fork and exec in the sandbox, exit status back.
func BenchmarkExec(b *testing.B) {
	for _, conc := range []int{1, 2} {
		b.Run(concName(conc), func(b *testing.B) {
			dir := b.TempDir()
			b.Cleanup(func() { checkHost(b, dir) })
			rt := newRuntime(b, dir, runtimeOptions{pool: 2})
			ctx := context.Background()
			sb, err := rt.Create(ctx, benchSpec("exec"))
			if err != nil {
				b.Fatal(err)
			}
			defer sb.Destroy(ctx)
			run := func(int) (time.Duration, error) {
				t := time.Now()
				res, err := sb.Exec(ctx, trueCmd)
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("true exited with %d", res.ExitCode)
				}
				return time.Since(t), err
			}
			if _, _, err := parallel(50, conc, run); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			lat, wall, err := parallel(b.N, conc, run)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(pct(lat, 50), "exec-p50-ms")
			b.ReportMetric(pct(lat, 90), "exec-p90-ms")
			b.ReportMetric(pct(lat, 99), "exec-p99-ms")
			b.ReportMetric(float64(len(lat))/wall.Seconds(), "execs/s")
		})
	}
}

// printTable writes a titled table to stdout: b.Log would keep only its
// first 10 lines.
func printTable(title string, rows [][]string) {
	fmt.Printf("%s\n%s\n", title, table(rows))
}

// table formats rows of cells as right-aligned columns.
func table(rows [][]string) string {
	width := map[int]int{}
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	var sb strings.Builder
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				sb.WriteString("  ")
			}
			fmt.Fprintf(&sb, "%*s", width[i], c)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}
