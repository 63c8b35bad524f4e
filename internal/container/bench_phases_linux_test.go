package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/network"
)

// BenchmarkCreatePhases shows where a create's and a destroy's time goes,
// one sandbox at a time, with the network pool on and off. The runtime's
// dependencies (layer cache, network manager, cgroup manager) are wrapped
// in clocks; the rest of a create is the runtime's own start: fork and
// exec of the agent in its namespaces, cgroup placement, the agent's
// setup (Go runtime start, mounts, pivot, capabilities, seccomp) and its
// first greeting. For that part it also reads the agent's CPU time (all
// its threads' schedstat) when Create returns: what the agent spent on its
// own start and how long it waited for a CPU.
func BenchmarkCreatePhases(b *testing.B) {
	for _, pc := range []struct {
		name string
		pool int
	}{{"pool", 32}, {"nopool", -1}} {
		b.Run(pc.name, func(b *testing.B) { benchPhases(b, pc.pool) })
	}
}

// clocks accumulates durations by name; safe for concurrent use.
type clocks struct {
	mu sync.Mutex // guards following fields
	d  map[string]time.Duration
}

func (c *clocks) add(name string, since time.Time) {
	el := time.Since(since)
	c.mu.Lock()
	c.d[name] += el
	c.mu.Unlock()
}

// take returns the durations so far and starts again.
func (c *clocks) take() map[string]time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.d
	c.d = map[string]time.Duration{}
	return d
}

type timedLayers struct {
	layerRoots
	c *clocks
}

func (t timedLayers) DetachedRoot(ctx context.Context, id string, layers []layerspec.Layer, upper string) (*os.File, func(), error) {
	defer t.c.add("overlay root", time.Now())
	f, release, err := t.layerRoots.DetachedRoot(ctx, id, layers, upper)
	if err != nil {
		return nil, nil, err
	}
	return f, func() {
		defer t.c.add("root release", time.Now())
		release()
	}, nil
}

func (t timedLayers) View(ctx context.Context, layers []layerspec.Layer) (string, func(), error) {
	defer t.c.add("agent lookup (layer view)", time.Now())
	return t.layerRoots.View(ctx, layers)
}

type timedNetworks struct {
	networks
	c *clocks
}

func (t timedNetworks) Acquire(ctx context.Context, id string, p network.Policy) (*network.Endpoint, error) {
	defer t.c.add("network acquire", time.Now())
	return t.networks.Acquire(ctx, id, p)
}

func (t timedNetworks) Release(ctx context.Context, id string) error {
	defer t.c.add("network release", time.Now())
	return t.networks.Release(ctx, id)
}

type timedCgroups struct {
	cgroupManager
	c *clocks
}

func (t timedCgroups) Create(ctx context.Context, id string, l cgroups.Limits) (*cgroups.Group, error) {
	defer t.c.add("cgroups create", time.Now())
	return t.cgroupManager.Create(ctx, id, l)
}

func benchPhases(b *testing.B, pool int) {
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	rt := newRuntime(b, dir, runtimeOptions{pool: pool})
	c := &clocks{d: map[string]time.Duration{}}
	// Before any sandbox exists, so nothing else reads them.
	rt.opt.Layers = timedLayers{rt.opt.Layers, c}
	rt.opt.Network = timedNetworks{rt.opt.Network, c}
	rt.opt.Cgroups = timedCgroups{rt.opt.Cgroups, c}
	ctx := context.Background()
	for i := range 4 {
		if _, err := cycleOnce(ctx, rt, fmt.Sprintf("warm-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	createDeps := []string{"agent lookup (layer view)", "overlay root", "cgroups create", "network acquire"}
	destroyDeps := []string{"root release", "network release"}
	samples := map[string][]time.Duration{}
	c.take()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		// With a network of the node's: its acquisition is a phase.
		spec := benchSpec(fmt.Sprintf("ph-%d", i))
		spec.Network = benchLinked
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		cpu, wait := schedstat(sb.(*Sandbox).state.Pid)
		created := c.take()
		rest := t1.Sub(t0)
		for _, k := range createDeps {
			samples[k] = append(samples[k], created[k])
			rest -= created[k]
		}
		samples["start: fork → agent greeted, and the rest"] = append(samples["start: fork → agent greeted, and the rest"], rest)
		samples["create (to ready)"] = append(samples["create (to ready)"], t1.Sub(t0))
		samples["agent CPU until ready"] = append(samples["agent CPU until ready"], cpu)
		samples["agent waiting for a CPU"] = append(samples["agent waiting for a CPU"], wait)
		t2 := time.Now()
		if res, err := sb.Exec(ctx, trueCmd); err != nil || res.ExitCode != 0 {
			b.Fatalf("first exec: %v (exit %d)", err, res.ExitCode)
		}
		t3 := time.Now()
		samples["first exec"] = append(samples["first exec"], t3.Sub(t2))
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		destroyed := c.take()
		rest = t4.Sub(t3)
		for _, k := range destroyDeps {
			samples[k] = append(samples[k], destroyed[k])
			rest -= destroyed[k]
		}
		samples["kill, wait, unmount upper, cgroups rmdir, dir"] = append(samples["kill, wait, unmount upper, cgroups rmdir, dir"], rest)
		samples["destroy"] = append(samples["destroy"], t4.Sub(t3))
		samples["cycle"] = append(samples["cycle"], t4.Sub(t0))
	}
	b.StopTimer()
	rows := [][]string{{"phase", "p50 ms", "p90 ms"}}
	for _, k := range []string{"agent lookup (layer view)", "overlay root", "cgroups create", "network acquire",
		"start: fork → agent greeted, and the rest", "  agent CPU until ready", "  agent waiting for a CPU", "create (to ready)",
		"first exec", "root release", "network release", "kill, wait, unmount upper, cgroups rmdir, dir", "destroy", "cycle"} {
		s := samples[strings.TrimSpace(k)]
		rows = append(rows, []string{k, fmt.Sprintf("%.3f", pct(s, 50)), fmt.Sprintf("%.3f", pct(s, 90))})
	}
	if b.N > 1 { // not for the framework's 1-iteration probe
		self := procFields("/proc/self/status", "VmRSS")
		printTable(fmt.Sprintf("%s: %d sandboxes, one at a time (the create rows above \"create\" sum to it); the node (test) process: VmRSS %d MiB", b.Name(), b.N, self["VmRSS"]/1024), rows)
	}
	b.ReportMetric(pct(samples["create (to ready)"], 50), "ready-p50-ms")
	b.ReportMetric(pct(samples["start: fork → agent greeted, and the rest"], 50), "start-p50-ms")
	b.ReportMetric(pct(samples["agent CPU until ready"], 50), "agent-cpu-p50-ms")
	b.ReportMetric(pct(samples["network acquire"], 50), "net-p50-ms")
}

// schedstat sums the time pid's threads ran and waited for a CPU
// (/proc/<pid>/task/*/schedstat: ns on CPU, ns runnable but waiting).
func schedstat(pid int) (run, wait time.Duration) {
	tasks, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name(), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		r, _ := strconv.ParseInt(f[0], 10, 64)
		w, _ := strconv.ParseInt(f[1], 10, 64)
		run += time.Duration(r)
		wait += time.Duration(w)
	}
	return run, wait
}
