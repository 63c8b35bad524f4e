package network

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkAcquireRelease measures Acquire from a warm pool (the pool is
// refilled, untimed, before each Acquire) and Release, and reports their
// medians.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, pc := range []struct {
		name string
		p    Policy
	}{
		{"none", Policy{}},
		{"open", Policy{Mode: ModeOpen}},
		{"allowlist", Policy{Mode: ModeAllowlist, Allow: []Rule{
			{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Proto: ProtoTCP, Ports: PortRange{443, 443}},
			{Prefix: netip.MustParsePrefix("10.99.0.0/24")},
			{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Proto: ProtoUDP, Ports: PortRange{53, 53}},
		}}},
	} {
		b.Run(pc.name, func(b *testing.B) {
			newWorld(b)
			opt := testOptions(b, b.TempDir())
			opt.PoolSize = 8
			m := newManager(b, opt)
			ctx := context.Background()
			var acq, rel []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				waitPool(b, m, opt.PoolSize)
				b.StartTimer()
				id := "b" + strconv.Itoa(i)
				start := time.Now()
				if _, err := m.Acquire(ctx, id, pc.p); err != nil {
					b.Fatal(err)
				}
				acq = append(acq, time.Since(start))
				start = time.Now()
				if err := m.Release(ctx, id); err != nil {
					b.Fatal(err)
				}
				rel = append(rel, time.Since(start))
			}
			b.StopTimer()
			b.ReportMetric(float64(percentile(acq, .5).Microseconds()), "acquire-p50-µs")
			b.ReportMetric(float64(percentile(acq, .9).Microseconds()), "acquire-p90-µs")
			b.ReportMetric(float64(percentile(rel, .5).Microseconds()), "release-p50-µs")
		})
	}
}

// BenchmarkFirewall measures the nftables part alone: adding and then
// deleting one sandbox's elements while n other sandboxes' are in the
// table (each with an open policy and a 3-rule allowlist's worth of
// range elements, the worst case for the concatenated range sets).
func BenchmarkFirewall(b *testing.B) {
	needRoot(b)
	for _, n := range []int{0, 1000, 4000} {
		for _, pc := range []struct {
			name string
			c    func() *compiled
		}{
			{"spoof", nil},
			{"open", func() *compiled { return mustCompile(b, Policy{Mode: ModeOpen}) }},
			{"allowlist3", func() *compiled {
				return mustCompile(b, Policy{Mode: ModeAllowlist, Allow: []Rule{
					{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Proto: ProtoTCP, Ports: PortRange{443, 443}},
					{Prefix: netip.MustParsePrefix("10.99.0.0/24")},
					{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Proto: ProtoUDP, Ports: PortRange{53, 53}},
				}})
			}},
		} {
			b.Run(fmt.Sprintf("%s/live=%d", pc.name, n), func(b *testing.B) {
				fw, err := newFirewall(testName)
				if err != nil {
					b.Fatal(err)
				}
				defer fw.close()
				defer func() { _ = fw.remove() }()
				rng := prefixRange(testRange)
				bg := mustCompile(b, Policy{Mode: ModeOpen, Allow: []Rule{
					{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Proto: ProtoTCP, Ports: PortRange{443, 443}},
					{Prefix: netip.MustParsePrefix("10.99.0.0/24")},
				}})
				var elems []elem
				for i := range n {
					a := addrOf(rng.first + 1 + uint32(i))
					elems = append(elems, spoofElem(fmt.Sprintf("%s%08x", testName, u32(a)), a))
					elems = append(elems, policyElems(a, bg)...)
				}
				if err := fw.install(layout{rng: testRange, never: []addrRange{rng}}, elems); err != nil {
					b.Fatal(err)
				}
				a := addrOf(rng.last - 1)
				var es []elem
				if pc.c == nil {
					es = []elem{spoofElem("x", a)}
				} else {
					es = policyElems(a, pc.c())
				}
				var add, del []time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					start := time.Now()
					if err := fw.apply(es, nil); err != nil {
						b.Fatal(err)
					}
					add = append(add, time.Since(start))
					start = time.Now()
					if err := fw.apply(nil, es); err != nil {
						b.Fatal(err)
					}
					del = append(del, time.Since(start))
				}
				b.StopTimer()
				b.ReportMetric(float64(len(es)), "elems")
				b.ReportMetric(float64(percentile(add, .5).Microseconds()), "add-p50-µs")
				b.ReportMetric(float64(percentile(del, .5).Microseconds()), "del-p50-µs")
			})
		}
	}
}

func mustCompile(b testing.TB, p Policy) *compiled {
	z := testZones()
	c, err := compile(context.Background(), p, fakeResolver{}, []netip.Addr{netip.MustParseAddr("10.99.0.53")}, z)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// TestDensity holds many sandbox networks at once and reports the kernel
// memory each costs. It runs with DSEC_NET_DENSITY=<count> (e.g. 1000).
func TestDensity(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DSEC_NET_DENSITY"))
	if n <= 0 {
		t.Skip("set DSEC_NET_DENSITY=<count> to hold that many sandbox networks")
	}
	w := newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = -1
	m := newManager(t, opt)
	ctx := context.Background()
	runtime.GC()
	before := meminfo(t)
	start := time.Now()
	var acq []time.Duration
	var eps []*Endpoint
	for i := range n {
		s := time.Now()
		ep, err := m.Acquire(ctx, "d"+strconv.Itoa(i), Policy{Mode: ModeOpen})
		if err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
		acq = append(acq, time.Since(s))
		eps = append(eps, ep)
	}
	elapsed := time.Since(start)
	time.Sleep(time.Second) // let deferred kernel work settle
	after := meminfo(t)
	kib := func(k string) float64 { return float64(before[k]-after[k]) / float64(n) }
	t.Logf("%d sandbox networks in %v (create without pool: p50 %v, p90 %v, last 100 p50 %v)", n, elapsed,
		percentile(acq, .5), percentile(acq, .9), percentile(acq[len(acq)-min(100, n):], .5))
	t.Logf("per sandbox: MemAvailable -%.0f KiB, Slab +%.0f KiB (SUnreclaim +%.0f KiB), Percpu +%.0f KiB",
		kib("MemAvailable"), -kib("Slab"), -kib("SUnreclaim"), -kib("Percpu"))
	t.Logf("extrapolated to 4000: MemAvailable -%.0f MiB", kib("MemAvailable")*4000/1024)
	// Still working at this density: the last one reaches the internet.
	expectReach(t, eps[n-1].NetnsPath, "last sandbox", []target{{"internet", inetPublic, 80}}, true)
	// One more policy change and release at this density.
	s := time.Now()
	must(t, m.SetPolicy(ctx, eps[0].ID, Policy{}))
	t.Logf("SetPolicy with %d live: %v", n, time.Since(s))
	start = time.Now()
	for _, ep := range eps {
		must(t, m.Release(ctx, ep.ID))
	}
	t.Logf("released %d in %v", n, time.Since(start))
	_ = w
}

// meminfo returns /proc/meminfo in KiB.
func meminfo(t testing.TB) map[string]int64 {
	f, err := os.Open("/proc/meminfo")
	must(t, err)
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		out[k] = n
	}
	return out
}
