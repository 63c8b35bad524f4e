package vmtier

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/vminit"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// BenchmarkCreate creates b.N microVMs one after the other (use
// -benchtime=5x) and reports create-to-ready p50 and p99 (with so few
// runs, p99 is the slowest), the host-side steps' p50 (QEMU spawned, QMP
// answered, cont, agent hello), the guest's own timings from its ready
// line, exec p50 (true, 10 runs a VM) and QEMU's VmRSS once the guest is
// ready and idle. -v logs every create's steps. The guest kernel is
// prepared first (as the node does at start-up; its cost, mostly apt-cache
// reading the index, is reported as s-prepare).
func BenchmarkCreate(b *testing.B) {
	rt, _ := newRuntime(b)
	ctx := context.Background()
	took := prepare(b, rt)
	var ready, qmp, cont, serial, execs []time.Duration
	var rss []int64
	guest := map[string][]float64{}
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		id := fmt.Sprintf("mvm-b%d", i)
		seen := watchSerial(filepath.Join(rt.opt.StateDir, id, vmm.SerialLog), start)
		sb, err := rt.Create(ctx, busyboxSpec(id, Tier))
		if err != nil {
			b.Fatalf("Create: %v", err)
		}
		ready = append(ready, time.Since(start))
		if d := testenv.Recv(b, seen, 5*time.Minute, "the serial console's READY"); d > 0 {
			serial = append(serial, d)
		}
		msb := sb.(*Sandbox)
		qmp = append(qmp, msb.timing.QMP)
		cont = append(cont, msb.timing.Cont)
		line := readyLineOf(b, msb)
		for k, v := range readyFields(line) {
			guest[k] = append(guest[k], v)
		}
		rss = append(rss, vmRSS(msb.Pid()))
		for range 10 {
			s := time.Now()
			if _, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}); err != nil {
				b.Fatalf("Exec: %v", err)
			}
			execs = append(execs, time.Since(s))
		}
		b.Logf("create %d: ready %v %+v; %s", i, ready[len(ready)-1].Round(time.Millisecond), msb.timing, line)
		if err := sb.Destroy(ctx); err != nil {
			b.Fatalf("Destroy: %v", err)
		}
	}
	b.ReportMetric(pct(ready, 50).Seconds(), "s-ready-p50")
	b.ReportMetric(pct(ready, 99).Seconds(), "s-ready-p99")
	b.ReportMetric(pct(qmp, 50).Seconds(), "s-qmp-p50")
	b.ReportMetric(pct(cont, 50).Seconds(), "s-cont-p50")
	if len(serial) > 0 {
		b.ReportMetric(pct(serial, 50).Seconds(), "s-serial-ready-p50")
	}
	b.ReportMetric(took.Seconds(), "s-prepare")
	for _, k := range []string{"init", "uptime"} {
		if v := guest[k]; len(v) > 0 {
			slices.Sort(v)
			b.ReportMetric(v[len(v)/2], "s-guest-"+k+"-p50")
		}
	}
	b.ReportMetric(float64(pct(execs, 50).Microseconds())/1000, "ms-exec-p50")
	slices.Sort(rss)
	b.ReportMetric(float64(rss[len(rss)/2])/(1<<20), "MiB-qemu-rss")
}

// BenchmarkCreateParallel4 creates 4 microVMs at once, b.N times, and
// reports creates per second and the creates' ready p50 and slowest.
func BenchmarkCreateParallel4(b *testing.B) {
	rt, _ := newRuntime(b)
	ctx := context.Background()
	b.ReportMetric(prepare(b, rt).Seconds(), "s-prepare")
	var ready []time.Duration
	var wall time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		var mu sync.Mutex
		var wg sync.WaitGroup
		sbs := make([]sandbox.Sandbox, 4)
		errs := make([]error, 4)
		for j := range 4 {
			n++
			id := fmt.Sprintf("mvm-p%d", n)
			wg.Go(func() {
				s := time.Now()
				sbs[j], errs[j] = rt.Create(ctx, busyboxSpec(id, Tier))
				mu.Lock()
				ready = append(ready, time.Since(s))
				mu.Unlock()
			})
		}
		testenv.WaitGroup(b, &wg, 10*time.Minute, "the parallel creates")
		wall += time.Since(start)
		for j, sb := range sbs {
			if errs[j] != nil {
				b.Errorf("Create: %v", errs[j])
				continue
			}
			sb.Destroy(ctx)
		}
		if b.Failed() {
			b.FailNow()
		}
	}
	b.ReportMetric(float64(len(ready))/wall.Seconds(), "creates/s")
	b.ReportMetric(pct(ready, 50).Seconds(), "s-ready-p50")
	b.ReportMetric(pct(ready, 100).Seconds(), "s-ready-max")
}

// prepare fetches the guest kernel and builds the initramfs, as the node
// does when it starts, and returns how long that took.
func prepare(b *testing.B, rt *Runtime) time.Duration {
	s := time.Now()
	if _, err := rt.Prepare(context.Background()); err != nil {
		b.Fatalf("Prepare: %v", err)
	}
	return time.Since(s)
}

// watchSerial polls the serial log path every 5 ms for the guest's ready
// line and sends the time from start it was first seen (0 if not within
// a minute).
func watchSerial(path string, start time.Time) <-chan time.Duration {
	ch := make(chan time.Duration, 1)
	go func() {
		for time.Since(start) < time.Minute {
			if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), vminit.ReadyPrefix) {
				ch <- time.Since(start)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		ch <- 0
	}()
	return ch
}

// pct returns the p-th percentile (nearest rank) of d, sorting it.
func pct(d []time.Duration, p int) time.Duration {
	slices.Sort(d)
	i := (len(d)*p + 99) / 100
	return d[min(max(i-1, 0), len(d)-1)]
}

// readyLineOf returns the guest's ready line from the VM's serial log.
func readyLineOf(tb testing.TB, sb *Sandbox) string {
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, _ := os.ReadFile(sb.vm.SerialLog())
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, vminit.ReadyPrefix) {
				return strings.TrimSpace(l)
			}
		}
		if time.Now().After(deadline) {
			tb.Logf("no ready line in the serial log: %q", b)
			return ""
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readyFields returns the ready line's fields that are durations in
// seconds ("uptime=2.100s" gives uptime: 2.1).
func readyFields(line string) map[string]float64 {
	out := map[string]float64{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !strings.HasSuffix(v, "s") || strings.HasSuffix(v, "ms") {
			continue
		}
		if x, err := strconv.ParseFloat(strings.TrimSuffix(v, "s"), 64); err == nil {
			out[k] = x
		}
	}
	return out
}

// vmRSS is the resident set of process pid (/proc/pid/status VmRSS), in
// bytes, or 0.
func vmRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkSnapshot boots one microVM and measures the capture of its
// writable state (the agent freezes, lists and streams its upper; the
// layer build after the thaw is not counted), b.N rounds of: a full
// snapshot of a small tree (~100 entries, 400 KiB), an incremental one
// after a one-file change, and one after writing 16 MiB more (removed
// again before the next round). It reports each's p50 and the frozen
// time of each.
func BenchmarkSnapshot(b *testing.B) {
	rt, _ := newRuntime(b)
	ctx := context.Background()
	sb, err := rt.Create(ctx, busyboxSpec("mvm-bsnap", Tier))
	if err != nil {
		b.Fatalf("Create: %v", err)
	}
	b.Cleanup(func() { sb.Destroy(context.Background()) })
	msb := sb.(*Sandbox)
	sh := func(script string) {
		b.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sh", "-c", script}}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%q: %+v, %v", script, res, err)
		}
	}
	sh(`mkdir -p /data && cd /data && for d in 1 2 3 4 5 6 7 8 9 10; do mkdir d$d; for f in 1 2 3 4 5 6 7 8 9; do head -c 4096 /dev/urandom > d$d/f$f; done; done`)
	capture := func(since *sandbox.StateIndex) (*sandbox.StateIndex, sandbox.CaptureStats, time.Duration) {
		b.Helper()
		dst := filepath.Join(b.TempDir(), "tree")
		start := time.Now()
		idx, st, err := msb.CaptureState(ctx, dst, since)
		if err != nil {
			b.Fatalf("CaptureState: %v", err)
		}
		took := time.Since(start)
		os.RemoveAll(dst)
		return idx, st, took
	}
	var full, fullFrozen, incr, incrFrozen, big, bigFrozen []time.Duration
	for b.Loop() {
		idx, st, d := capture(nil)
		full, fullFrozen = append(full, d), append(fullFrozen, st.Frozen)
		sh(`echo change >> /data/d1/f1`)
		idx, st, d = capture(idx)
		incr, incrFrozen = append(incr, d), append(incrFrozen, st.Frozen)
		sh(`dd if=/dev/urandom of=/data/big bs=1M count=16 2>/dev/null`)
		_, st, d = capture(idx)
		big, bigFrozen = append(big, d), append(bigFrozen, st.Frozen)
		if st.Bytes != 16<<20 {
			b.Fatalf("after +16 MiB the capture read %d bytes", st.Bytes)
		}
		sh(`rm /data/big`)
		b.Logf("full %v (frozen %v), incremental %v (frozen %v), +16 MiB %v (frozen %v)", full[len(full)-1], fullFrozen[len(full)-1],
			incr[len(incr)-1], incrFrozen[len(incr)-1], big[len(big)-1], bigFrozen[len(big)-1])
	}
	ms := func(d []time.Duration) float64 { return float64(pct(d, 50).Microseconds()) / 1000 }
	b.ReportMetric(ms(full), "ms-full-p50")
	b.ReportMetric(ms(fullFrozen), "ms-full-frozen-p50")
	b.ReportMetric(ms(incr), "ms-incremental-p50")
	b.ReportMetric(ms(incrFrozen), "ms-incremental-frozen-p50")
	b.ReportMetric(ms(big), "ms-16MiB-p50")
	b.ReportMetric(ms(bigFrozen), "ms-16MiB-frozen-p50")
}
