package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// waitPool waits up to 10 s for the pool to hold n namespaces.
func waitPool(t testing.TB, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.Stats().Pooled < n {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d namespaces after 10 s, want %d", m.Stats().Pooled, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[int(float64(len(d)-1)*p)]
}

func TestPoolAcquireIsFastAndRefills(t *testing.T) {
	newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = 16
	m := newManager(t, opt)
	ctx := context.Background()
	var acquire, release []time.Duration
	for round := range 3 {
		waitPool(t, m, opt.PoolSize) // the pool refills in the background
		var ids []string
		for i := range opt.PoolSize {
			id := fmt.Sprintf("r%d-%d", round, i)
			start := time.Now()
			if _, err := m.Acquire(ctx, id, Policy{Mode: ModeOpen}); err != nil {
				t.Fatal(err)
			}
			acquire = append(acquire, time.Since(start))
			ids = append(ids, id)
		}
		for _, id := range ids {
			start := time.Now()
			must(t, m.Release(ctx, id))
			release = append(release, time.Since(start))
		}
	}
	t.Logf("Acquire from a warm pool: p50 %v p90 %v max %v (n=%d)", percentile(acquire, .5), percentile(acquire, .9), slices.Max(acquire), len(acquire))
	t.Logf("Release: p50 %v p90 %v max %v", percentile(release, .5), percentile(release, .9), slices.Max(release))
	if p50 := percentile(acquire, .5); p50 > 5*time.Millisecond {
		t.Errorf("Acquire p50 %v from a warm pool, want ≤ 1 ms (5 ms with slack)", p50)
	}
}

func TestAcquireWithoutPool(t *testing.T) {
	w := newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = -1
	m := newManager(t, opt)
	start := time.Now()
	a, err := m.Acquire(context.Background(), "a", Policy{Mode: ModeOpen})
	must(t, err)
	t.Logf("Acquire with no pool: %v", time.Since(start))
	if s := m.Stats(); s.Pooled != 0 || s.Live != 1 {
		t.Errorf("stats %+v, want 1 live and none pooled", s)
	}
	expectReach(t, a.NetnsPath, "sandbox a", []target{{"internet", inetPublic, 80}}, true)
	_ = w
}

func TestCyclesLeakNothing(t *testing.T) {
	newWorld(t)
	opt := testOptions(t, t.TempDir())
	m := newManager(t, opt)
	ctx := context.Background()
	fds := openFDs(t)
	n := 500
	if testing.Short() {
		n = 50
	}
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		p := Policy{Mode: []Mode{ModeNone, ModeOpen, ModeAllowlist}[i%3], Allow: []Rule{{Prefix: netip.MustParsePrefix("10.99.0.0/24"), Proto: ProtoTCP}},
			Inbound: []Port{{ProtoTCP, 80}}}
		if _, err := m.Acquire(ctx, id, p); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			must(t, m.SetPolicy(ctx, id, Policy{Mode: ModeOpen}))
		}
		must(t, m.Release(ctx, id))
	}
	waitPool(t, m, opt.PoolSize) // then the pool stops building
	m.mu.Lock()
	inUse, owned := m.ipam.n, len(m.owned)
	m.mu.Unlock()
	if pooled := m.Stats().Pooled; inUse != pooled || owned != pooled {
		t.Errorf("after %d cycles: %d addresses and %d veths held, want the pool's %d", n, inUse, owned, pooled)
	}
	// Pool namespaces hold one file each.
	if got := openFDs(t); got > fds+opt.PoolSize+2 {
		t.Errorf("%d open files after %d cycles, %d before", got, n, fds)
	}
	must(t, m.Close(ctx))
	if got := openFDs(t); got > fds+2 {
		t.Errorf("%d open files after Close, %d before", got, fds)
	}
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}

func TestConcurrentUse(t *testing.T) {
	newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Go(func() {
			for i := range 25 {
				id := fmt.Sprintf("g%d-%d", g, i)
				if _, err := m.Acquire(ctx, id, Policy{}); err != nil {
					errs <- err
					return
				}
				if err := m.SetPolicy(ctx, id, Policy{Mode: ModeOpen}); err != nil {
					errs <- err
					return
				}
				_ = m.Stats()
				if err := m.Release(ctx, id); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent acquires")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestErrors(t *testing.T) {
	newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.Resolver = fakeResolver{}
	m := newManager(t, opt)
	ctx := context.Background()
	_, err := m.Acquire(ctx, "a", Policy{})
	must(t, err)
	for _, tc := range []struct {
		name  string
		err   error
		class errdefs.Class
	}{
		{"duplicate", second(m.Acquire(ctx, "a", Policy{})), errdefs.Conflict},
		{"bad id", second(m.Acquire(ctx, "../x", Policy{})), errdefs.Invalid},
		{"bad mode", second(m.Acquire(ctx, "b", Policy{Mode: "wide"})), errdefs.Invalid},
		{"unresolvable", second(m.Acquire(ctx, "b", Policy{Mode: ModeAllowlist, Allow: []Rule{{Host: "nope.example"}}})), errdefs.Invalid},
		{"ipv6 rule", m.SetPolicy(ctx, "a", Policy{Mode: ModeAllowlist, Allow: []Rule{{Prefix: netip.MustParsePrefix("2001:db8::/32")}}}), errdefs.Invalid},
		{"unknown sandbox", m.SetPolicy(ctx, "zz", Policy{}), errdefs.NotFound},
	} {
		if errdefs.ClassOf(tc.err) != tc.class {
			t.Errorf("%s: %v (class %s), want class %s", tc.name, tc.err, errdefs.ClassOf(tc.err), tc.class)
		}
	}
	if _, err := New(ctx, opt); errdefs.ClassOf(err) != errdefs.Conflict {
		t.Errorf("a second Manager of the same name: %v, want Conflict", err)
	}
	must(t, m.Release(ctx, "zz")) // unknown: nothing to do
	must(t, m.Release(ctx, "a"))
	must(t, m.Release(ctx, "a")) // idempotent
	must(t, m.Close(ctx))
	if _, err := m.Acquire(ctx, "c", Policy{}); errdefs.ClassOf(err) != errdefs.Unavailable {
		t.Errorf("Acquire after Close: %v, want Unavailable", err)
	}
}

func second[T any](_ T, err error) error { return err }

func TestRecoverAfterRestart(t *testing.T) {
	w := newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.Resolver = fakeResolver{"api.example": {inetPublic2}}
	ctx := context.Background()
	m1 := newManager(t, opt)
	a, err := m1.Acquire(ctx, "a", Policy{Mode: ModeAllowlist, Allow: []Rule{{Host: "api.example", Proto: ProtoTCP, Ports: PortRange{9000, 9000}}}})
	must(t, err)
	b, err := m1.Acquire(ctx, "b", Policy{Mode: ModeOpen})
	must(t, err)
	_, err = m1.Acquire(ctx, "c", Policy{})
	must(t, err)
	// The agent stops; its sandboxes keep running, and keep their policy.
	must(t, m1.Close(ctx))
	expectReach(t, a.NetnsPath, "a while no agent runs", []target{{"api.example:9000", inetPublic2, 9000}}, true)
	expectReach(t, a.NetnsPath, "a while no agent runs", []target{{"internet:80", inetPublic, 80}}, false)

	// Debris of a crash: a namespace nobody recorded, a record of a
	// namespace that is gone, and a veth of this Manager's form whose
	// namespace something else holds.
	ghost := filepath.Join(DefaultNetnsDir, opt.Name+"-ghost")
	held, err := sys.NewNetns(func() error {
		h, err := netlink.NewHandle(sys.NetlinkRoute)
		if err != nil {
			return err
		}
		defer h.Close()
		host, err := sys.ProcessNetns()
		if err != nil {
			return err
		}
		defer host.Close()
		stray := fmt.Sprintf("%s%08x", opt.Name, u32(testRange.Addr())+4000)
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: stray,
			PeerNamespace: netlink.NsFd(int(host.Fd()))})
	})
	must(t, err)
	defer held.Close()
	must(t, sys.BindNetns(held, ghost))
	must(t, writeRecord(filepath.Join(opt.StateDir, opt.Name, "gone.json"), record{ID: "gone", Addr: testRange.Addr().Next(), HostIf: "x"}))

	m2 := newManager(t, opt)
	if s := m2.Stats(); s.Live != 3 {
		t.Errorf("New adopted %d sandboxes, want 3", s.Live)
	}
	if _, err := os.Stat(ghost); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unrecorded namespace %s still there: %v", ghost, err)
	}
	err = m2.Recover(ctx, []string{"a", "b", "lost"})
	if errdefs.ClassOf(err) != errdefs.NotFound {
		t.Errorf("Recover: %v, want NotFound for sandbox lost", err)
	}
	if s := m2.Stats(); s.Live != 2 {
		t.Errorf("%d sandboxes live after Recover, want 2", s.Live)
	}
	if _, err := os.Stat(filepath.Join(DefaultNetnsDir, opt.Name+"-c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox c's namespace survived Recover: %v", err)
	}
	if l, err := netlink.LinkByName(fmt.Sprintf("%s%08x", opt.Name, u32(testRange.Addr())+4000)); err == nil {
		t.Errorf("stray veth %s survived Recover", l.Attrs().Name)
	}
	// The adopted sandboxes work as before and can be changed.
	ea, ok := m2.Endpoint("a")
	if !ok || ea.Addr != a.Addr || len(ea.Hosts["api.example"]) != 1 {
		t.Errorf("adopted endpoint a = %+v, want %+v", ea, a)
	}
	expectReach(t, a.NetnsPath, "adopted a", []target{{"api.example:9000", inetPublic2, 9000}}, true)
	expectReach(t, a.NetnsPath, "adopted a", []target{{"internet:80", inetPublic, 80}}, false)
	expectReach(t, b.NetnsPath, "adopted b", []target{{"internet:80", inetPublic, 80}}, true)
	must(t, m2.SetPolicy(ctx, "b", Policy{}))
	expectReach(t, b.NetnsPath, "adopted b", []target{{"internet:80", inetPublic, 80}}, false)
	// New sandboxes get other addresses.
	d, err := m2.Acquire(ctx, "d", Policy{Mode: ModeOpen})
	must(t, err)
	if d.Addr == a.Addr || d.Addr == b.Addr {
		t.Errorf("new sandbox got adopted address %s", d.Addr)
	}
	_ = w
}
