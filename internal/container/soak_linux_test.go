package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// soakPolicies vary the sandboxes' network policies, so that every kind
// of nftables element is added and must be removed again.
var soakPolicies = []*api.NetworkPolicy{
	nil,
	{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{
		{CIDR: "198.51.100.7"},
		{CIDR: "198.51.100.8", Proto: "tcp", Ports: "443"},
		{CIDR: "203.0.113.0/28"},
		{CIDR: "203.0.113.64/27", Proto: "udp", Ports: "5000-5100"},
	}},
	{Egress: api.EgressOpen},
}

// soakCycles is how many create/exec/destroy cycles the soak runs.
func soakCycles() int {
	if testing.Short() {
		return 200
	}
	return 2000
}

// TestSoak runs 2,000 create/exec/destroy cycles, 20 at a time, and
// checks that the node is back where it started: no sandbox directory,
// upper or root mount, cgroup, network namespace, sandbox veth, nftables
// element or sandbox process is left, first with the runtime still open
// (only the network pool remains) and then, once it closed, not even the
// pool, the nftables table or a mount.
func TestSoak(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	const workers, pool = 20, 20
	rt := newRuntime(t, dir, runtimeOptions{pool: pool})
	cycles := soakCycles()

	var (
		next    atomic.Int64
		failed  atomic.Int64
		mu      sync.Mutex
		creates []time.Duration
		wg      sync.WaitGroup
	)
	ctx := context.Background()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= cycles || failed.Load() > 10 {
					return
				}
				d, err := soakCycle(ctx, rt.Runtime, i, w.image())
				if err != nil {
					failed.Add(1)
					t.Errorf("cycle %d: %v", i, err)
					continue
				}
				mu.Lock()
				creates = append(creates, d)
				mu.Unlock()
			}
		}()
	}
	testenv.WaitGroup(t, &wg, 10*time.Minute, "the soak's workers")
	elapsed := time.Since(start)
	slices.Sort(creates)
	if len(creates) > 0 {
		t.Logf("%d cycles in %v (%.0f/s), %d workers; create p50 %v, p99 %v, max %v", len(creates), elapsed.Round(time.Millisecond),
			float64(len(creates))/elapsed.Seconds(), workers,
			creates[len(creates)/2].Round(time.Microsecond), creates[len(creates)*99/100].Round(time.Microsecond),
			creates[len(creates)-1].Round(time.Microsecond))
	}
	if t.Failed() {
		return
	}
	checkIdle(t, rt, dir, pool)
}

// soakCycle creates sandbox i, runs a command in it, checks the result
// and destroys it. It returns how long the create took.
func soakCycle(ctx context.Context, rt *Runtime, i int, img sandbox.Image) (time.Duration, error) {
	id := fmt.Sprintf("soak-%05d", i)
	t0 := time.Now()
	sb, err := rt.Create(ctx, sandbox.Spec{ID: id, Image: img, MemoryMB: 64, DiskMB: 16,
		Network: soakPolicies[i%len(soakPolicies)]})
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	d := time.Since(t0)
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		Cmd: sh(`echo "$1" > /tmp/id && cat /tmp/id && hostname`, id)}})
	if err == nil && (res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, id+"\n")) {
		err = fmt.Errorf("exec: %+v", res)
	}
	if derr := sb.Destroy(ctx); derr != nil && err == nil {
		err = fmt.Errorf("destroy: %w", derr)
	}
	return d, err
}

// checkIdle checks a runtime with no sandboxes: nothing of them is left,
// and what its network pool holds (a veth and an anti-spoofing element
// per pooled namespace) is all there is.
func checkIdle(t *testing.T, rt *testRuntime, dir string, pool int) {
	t.Helper()
	rt.mu.Lock()
	n := len(rt.sandboxes)
	rt.mu.Unlock()
	if n != 0 {
		t.Errorf("the runtime still tracks %d sandboxes", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(ents) != 0 {
		t.Errorf("sandbox directories left: %d (first %s)", len(ents), ents[0].Name())
	}
	for _, m := range testenv.Mounts(t, dir) {
		rel, _ := filepath.Rel(dir, m)
		if strings.HasPrefix(rel, "sandboxes/") || strings.HasPrefix(rel, "layers/roots/") {
			t.Errorf("mount left: %s", m)
		}
	}
	if st := rt.nets.Stats(); st.Live != 0 {
		t.Errorf("the network manager still has %d live sandboxes", st.Live)
	}
	// The pool refills and released namespaces' veths go asynchronously:
	// wait until the node shows exactly the full pool.
	var left []string
	var elems map[string]int
	deadline := time.Now().Add(20 * time.Second)
	for {
		left = left[:0]
		links := 0
		for _, l := range testenv.Live(testenv.HostLeftovers(rt.names)) {
			if strings.HasPrefix(l, "link ") {
				links++
			} else if !strings.HasPrefix(l, "nftables table ") {
				left = append(left, l)
			}
		}
		var err error
		if elems, err = testenv.NftElements(rt.names.Net); err != nil {
			t.Fatal(err)
		}
		pooled := rt.nets.Stats().Pooled
		if len(left) == 0 && pooled == pool && links == pool && poolElems(elems, pool) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("idle node: %d pooled, %d sandbox veths (want %d); leftovers %q; nftables elements %v", pooled, links, pool, left, elems)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// staticSets are the table's sets that hold configuration, not sandboxes.
var staticSets = []string{"never", "private", "shards", "uplinks"}

// poolElems reports whether the table's sandbox sets hold exactly the
// pool's anti-spoofing elements.
func poolElems(elems map[string]int, pool int) bool {
	for set, n := range elems {
		switch {
		case slices.Contains(staticSets, set):
		case set == "spoof":
			if n != pool {
				return false
			}
		case n != 0:
			return false
		}
	}
	return elems != nil
}

// noSandboxProcs fails the test if a process of this test process's
// sandboxes is left: in a cgroup under the runtime's parent, or running as
// a sandbox uid among this process's descendants (a guest that escaped
// its cgroup, or was never reaped).
func noSandboxProcs(t *testing.T, nm testenv.Sandboxes) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		all := testenv.Procs()
		parent := make(map[int]int, len(all))
		for _, p := range all {
			parent[p.Pid] = p.PPid
		}
		ours := func(pid int) bool {
			for i := 0; i < 64 && pid > 1; i++ {
				if pid = parent[pid]; pid == os.Getpid() {
					return true
				}
			}
			return false
		}
		var left []testenv.Proc
		for _, p := range testenv.SandboxProcs(DefaultIDBase, 65536, nm.CgroupParent) {
			if ours(p.Pid) || strings.Contains(p.Cgroups, ":/"+nm.CgroupParent+"/") {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("sandbox processes left: %v", left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
