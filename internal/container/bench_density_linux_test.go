package container

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// BenchmarkDensity creates DSEC_BENCH_DENSITY (default 4,000) sandboxes
// with networking on, from 8 goroutines, runs `true` in each and leaves
// them idle; then it reports the host memory each costs (MemAvailable,
// Slab and the rest of /proc/meminfo, per sandbox, after dropping
// reclaimable caches on both sides), the agents' own memory (RSS split
// into anonymous and file pages, PSS), the create rate as the count
// grows, and destroys them all; the host must be left clean. Each b.N is
// one such round: run it with -benchtime 1x.
func BenchmarkDensity(b *testing.B) {
	n := 4000
	if v := os.Getenv("DSEC_BENCH_DENSITY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("DSEC_BENCH_DENSITY=%q: want a positive count", v)
		}
	}
	raisePidMax(b, n)
	for range b.N {
		densityRound(b, n)
	}
}

// hostPidMax is what a node needs: each agent is a Go process with ~8
// threads, each a task with a pid, so 4,000 sandboxes take 32,000 pids,
// the kernel's default pid_max (32,768) on hosts without systemd, which
// raises it to this.
const hostPidMax = 4194304

// raisePidMax raises kernel.pid_max to hostPidMax for the benchmark if n
// agents could exhaust it (and so every fork on the host), and puts the
// old value back at the end.
func raisePidMax(b *testing.B, n int) {
	const path = "/proc/sys/kernel/pid_max"
	old, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	cur, _ := strconv.Atoi(strings.TrimSpace(string(old)))
	if cur >= n*16+16384 {
		return
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(hostPidMax)), 0o644); err != nil {
		b.Fatalf("kernel.pid_max is %d, too few for %d sandboxes, and raising it failed: %v", cur, n, err)
	}
	fmt.Printf("BenchmarkDensity: kernel.pid_max raised from %d to %d for the run\n", cur, hostPidMax)
	b.Cleanup(func() {
		if err := os.WriteFile(path, old, 0o644); err != nil {
			b.Errorf("restoring kernel.pid_max: %v", err)
		}
	})
}

// densityRange is the /16 the density benchmark's sandboxes take their
// addresses from: outside the /24s of names (10.224.0.0/12) and the
// network package's tests (10.160.0.0/11).
func densityRange() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(240 + os.Getpid()%8), 0, 0}), 16)
}

func densityRound(b *testing.B, n int) {
	const conc = 8
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	rt := newRuntime(b, dir, runtimeOptions{pool: 32, netRange: densityRange()})
	ctx := context.Background()
	if _, err := cycleOnce(ctx, rt, "warm"); err != nil {
		b.Fatal(err)
	}
	before := settledMeminfo(b)
	nsBefore := probeMountNS(b)

	var retries atomic.Int64 // creates retried after a retryable refusal
	sbs := make([]sandbox.Sandbox, n)
	done := make([]time.Duration, n) // since start, when sandbox i was ready
	start := time.Now()
	lat, _, err := parallel(n, conc, func(i int) (time.Duration, error) {
		t := time.Now()
		// Networking on: each with a veth pair of the node's.
		spec := benchSpec(fmt.Sprintf("d%d", i))
		spec.Network = benchLinked
		sb, err := rt.Create(ctx, spec)
		// A create the node could not finish in time under load made
		// nothing and says to retry later (Unavailable): a client does,
		// after a pause, and so does the benchmark (counted).
		for try := 0; err != nil && errdefs.ClassOf(err) == errdefs.Unavailable && try < 5; try++ {
			retries.Add(1)
			time.Sleep(time.Duration(200<<try) * time.Millisecond)
			sb, err = rt.Create(ctx, spec)
		}
		if err != nil {
			return 0, fmt.Errorf("sandbox %d: %w", i, err)
		}
		el := time.Since(t)
		sbs[i], done[i] = sb, time.Since(start)
		if _, err := sb.Exec(ctx, trueCmd); err != nil {
			return 0, fmt.Errorf("sandbox %d: %w", i, err)
		}
		return el, nil
	})
	b.Cleanup(func() {
		// After a failure: the sandboxes that were made, as many at a
		// time as they were made (one at a time takes hours at 4,000).
		_, _, _ = parallel(n, conc, func(i int) (struct{}, error) {
			if sbs[i] != nil {
				_ = sbs[i].Destroy(context.Background())
			}
			return struct{}{}, nil
		})
	})
	if err != nil {
		// Said now: the benchmark's own output waits for the cleanup.
		fmt.Printf("BenchmarkDensity: after %d sandboxes: %v\n", len(lat), err)
		b.Fatalf("after %d sandboxes: %v", len(lat), err)
	}
	createWall := time.Since(start)
	after := settledMeminfo(b)
	nsAfter := probeMountNS(b)
	agents := agentMemory(b, sbs)

	// The create rate as the count grows: the k-th step is the creates
	// that completed k-th (lat is in completion order too).
	slices.Sort(done)
	rows := [][]string{{"sandboxes", "creates/s", "create p50 ms", "create p99 ms"}}
	step := max(n/8, 1)
	for lo := 0; lo < n; lo += step {
		hi := min(lo+step, n)
		var from time.Duration
		if lo > 0 {
			from = done[lo-1]
		}
		rows = append(rows, []string{fmt.Sprintf("%d–%d", lo+1, hi), fmt.Sprintf("%.0f", float64(hi-lo)/(done[hi-1]-from).Seconds()),
			fmt.Sprintf("%.2f", pct(lat[lo:hi], 50)), fmt.Sprintf("%.2f", pct(lat[lo:hi], 99))})
	}

	per := func(key string) float64 { return float64(after[key]-before[key]) / float64(n) }
	mem := [][]string{{"per sandbox", "KiB"}}
	for _, k := range []string{"MemAvailable", "MemFree", "Slab", "SUnreclaim", "SReclaimable", "KernelStack", "PageTables", "AnonPages", "Shmem", "Percpu"} {
		mem = append(mem, []string{k + " Δ", fmt.Sprintf("%+.0f", per(k))})
	}
	for _, k := range []string{"VmRSS", "RssAnon", "RssFile", "RssShmem", "Pss", "Threads"} {
		mem = append(mem, []string{"agent " + k, fmt.Sprintf("%.0f", agents[k])})
	}
	mem = append(mem, []string{"memory cgroup usage", fmt.Sprintf("%.0f", agents["cgroup"])})
	// The node's side: its memory grows with the sandboxes it tracks, and
	// a fork copies its page tables.
	self := procFields("/proc/self/status", "VmRSS")
	mem = append(mem, []string{"node VmRSS (all, MiB)", fmt.Sprintf("%d", self["VmRSS"]/1024)})

	// Destroy, and what comes back.
	t := time.Now()
	if _, _, err := parallel(n, conc, func(i int) (struct{}, error) {
		err := sbs[i].Destroy(ctx)
		sbs[i] = nil
		return struct{}{}, err
	}); err != nil {
		b.Fatal(err)
	}
	destroyWall := time.Since(t)
	nm, _ := names(dir)
	waitVethsGone(b, nm.Net, 32)
	gone := settledMeminfo(b)

	b.ReportMetric(float64(n), "sandboxes")
	b.ReportMetric(float64(retries.Load()), "retried-creates")
	b.ReportMetric(float64(n)/createWall.Seconds(), "creates/s")
	b.ReportMetric(float64(n)/destroyWall.Seconds(), "destroys/s")
	b.ReportMetric(-per("MemAvailable"), "MemAvailable-KiB/sandbox")
	b.ReportMetric(per("Slab"), "Slab-KiB/sandbox")
	b.ReportMetric(agents["RssAnon"], "agent-anon-KiB")
	printTable(fmt.Sprintf("%s: %d idle sandboxes (networking on), %d creating at a time: %.1f s, %.0f/s",
		b.Name(), n, conc, createWall.Seconds(), float64(n)/createWall.Seconds()), rows)
	printTable(fmt.Sprintf("host memory per sandbox (after drop_caches; other processes on the host move it too) and agent memory (mean of %d):", n), mem)
	printTable("a new mount namespace (fork + exec of /bin/true with and without CLONE_NEWNS, p50 of 20) against mounts in the node's namespace:", [][]string{
		{"when", "mounts", "fork+exec ms", "with CLONE_NEWNS ms"},
		{"before", fmt.Sprint(nsBefore.mounts), fmt.Sprintf("%.2f", nsBefore.plain), fmt.Sprintf("%.2f", nsBefore.newns)},
		{fmt.Sprintf("%d live", n), fmt.Sprint(nsAfter.mounts), fmt.Sprintf("%.2f", nsAfter.plain), fmt.Sprintf("%.2f", nsAfter.newns)},
	})
	fmt.Printf("destroyed in %.1f s (%.0f/s); after the kernel's teardown MemAvailable is %+.0f MiB from before, Slab %+.0f MiB\n\n",
		destroyWall.Seconds(), float64(n)/destroyWall.Seconds(),
		float64(gone["MemAvailable"]-before["MemAvailable"])/1024, float64(gone["Slab"]-before["Slab"])/1024)
}

// mountNSProbe is what a new mount namespace costs: every mount of the
// parent's namespace is copied into it (and each sandbox adds its upper,
// root and netns mounts to the node's).
type mountNSProbe struct {
	mounts       int
	plain, newns float64 // ms, p50
}

func probeMountNS(b *testing.B) mountNSProbe {
	b.Helper()
	var p mountNSProbe
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		p.mounts = strings.Count(string(mi), "\n")
	}
	run := func(flags uintptr) float64 {
		var lat []time.Duration
		for range 20 {
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
			t := time.Now()
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t))
		}
		return pct(lat, 50)
	}
	p.plain, p.newns = run(0), run(syscall.CLONE_NEWNS)
	return p
}

// settledMeminfo reads /proc/meminfo (KiB) after giving the kernel's
// asynchronous work (netns cleanup, RCU) a moment and dropping clean page
// cache and reclaimable slab, so that the deltas are what is pinned.
func settledMeminfo(b *testing.B) map[string]int64 {
	b.Helper()
	time.Sleep(2 * time.Second)
	syncFS()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		b.Logf("dropping caches: %v (deltas include page cache)", err)
	}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) > 0 {
			out[k], _ = strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return out
}

func syncFS() {
	// os has no sync(2); fsync of the root directory does not flush
	// others. Writes here are all to tmpfs, so there is little dirty data.
	if f, err := os.Open("/"); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// agentMemory returns the mean of each agent's (PID 1's) memory figures
// in KiB (Threads as a count) and of its memory cgroup's usage.
func agentMemory(b *testing.B, sbs []sandbox.Sandbox) map[string]float64 {
	b.Helper()
	sum := map[string]float64{}
	ctx := context.Background()
	for _, s := range sbs {
		sb := s.(*Sandbox)
		pid := sb.state.Pid
		for k, v := range procFields(filepath.Join("/proc", strconv.Itoa(pid), "status"), "VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads") {
			sum[k] += float64(v)
		}
		for k, v := range procFields(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"), "Pss") {
			sum[k] += float64(v)
		}
		if st, err := sb.Stats(ctx); err == nil {
			sum["cgroup"] += float64(st.MemoryBytes) / 1024
		}
	}
	for k := range sum {
		sum[k] /= float64(len(sbs))
	}
	return sum
}

// procFields reads "Key: value [kB]" lines of a /proc file.
func procFields(path string, keys ...string) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, want := range keys {
			if k == want {
				if fs := strings.Fields(v); len(fs) > 0 {
					out[k], _ = strconv.ParseInt(fs[0], 10, 64)
				}
			}
		}
	}
	return out
}

// waitVethsGone waits (up to a minute) until network name has no more
// than pooled veths: the kernel removes a sandbox's after its namespace
// goes, asynchronously.
func waitVethsGone(b *testing.B, name string, pooled int) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/sys/class/net")
		left := 0
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), name) {
				left++
			}
		}
		if left <= pooled {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.Logf("veths of %s still present after a minute (more than the pool's %d)", name, pooled)
}
