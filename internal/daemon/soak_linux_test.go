package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// soakPolicies vary the sandboxes' network policies, so that every kind
// of nftables element is added, adopted and removed.
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

// policyIndex returns the index in soakPolicies of a sandbox's policy.
func policyIndex(p *api.NetworkPolicy) int {
	b, _ := json.Marshal(p)
	for i, q := range soakPolicies {
		if c, _ := json.Marshal(q); string(c) == string(b) || (q == nil && (p == nil || p.Egress == "" || p.Egress == api.EgressNone) && len(p.Allow) == 0) {
			return i
		}
	}
	return -1
}

func soakRequest(i int) api.CreateSandboxRequest {
	return api.CreateSandboxRequest{
		Tier: api.TierContainer, Image: "busybox", CPU: 0.1, MemoryMB: 64, DiskMB: 16, TimeoutS: 1800,
		Network: soakPolicies[i%len(soakPolicies)],
	}
}

// soakExec runs a command in sandbox id that proves it works: it writes
// to its root and reads it back.
func soakExec(ctx context.Context, c *client.Client, id string) error {
	res, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", `echo "$1" > /tmp/id && cat /tmp/id`, "sh", id}})
	if err != nil {
		return fmt.Errorf("exec in %s: %w", id, err)
	}
	if res.ExitCode != 0 || res.Stdout != id+"\n" {
		return fmt.Errorf("exec in %s: %+v", id, res)
	}
	return nil
}

// soak is a load of create/exec/delete cycles against a daemon that the
// test may kill and restart under it.
type soak struct {
	t      *testing.T
	cycles int
	next   atomic.Int64 // cycles claimed
	done   atomic.Int64 // cycles completed
	errs   atomic.Int64

	creating atomic.Int64 // creates in flight

	mu    sync.Mutex // guards following fields
	epoch int        // incremented at each kill
	c     *client.Client
	up    chan struct{} // closed while a daemon serves
	// acked are sandboxes whose create returned and whose delete did not
	// begin; deleting, those whose delete began and did not return.
	acked, deleting map[string]bool
}

func newSoak(t *testing.T, cycles int, c *client.Client) *soak {
	s := &soak{t: t, cycles: cycles, c: c, up: make(chan struct{}),
		acked: map[string]bool{}, deleting: map[string]bool{}}
	close(s.up)
	return s
}

// client waits for a serving daemon and returns its client and epoch.
func (s *soak) client() (*client.Client, int) {
	for {
		s.mu.Lock()
		up := s.up
		s.mu.Unlock()
		// bounded: a pause (s.pause) lasts until its resume, which every path runs
		<-up
		s.mu.Lock()
		c, e, serving := s.c, s.epoch, s.up == up
		s.mu.Unlock()
		if serving {
			return c, e
		}
	}
}

// down marks the daemon as going away: calls that fail from now on are
// the crash's doing, and workers wait for resume.
func (s *soak) down() {
	s.mu.Lock()
	s.epoch++
	s.up = make(chan struct{})
	s.mu.Unlock()
}

// resume lets workers go on against a new daemon.
func (s *soak) resume(c *client.Client) {
	s.mu.Lock()
	s.c = c
	close(s.up)
	s.mu.Unlock()
}

// crashed reports whether a call made in epoch e may have failed because
// the daemon was killed.
func (s *soak) crashed(e int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch != e
}

func (s *soak) fail(format string, args ...any) {
	s.errs.Add(1)
	s.t.Errorf(format, args...)
}

// worker runs cycles until all are claimed: create a sandbox, run a
// command in it, delete the one of the previous cycle (so that a kill
// finds sandboxes in every state: being created, running, being
// deleted). A call cut off by a kill is repeated against the next daemon:
// a create (whose sandbox is then the reconciler's to clean up), or an
// exec or delete of the same sandbox, which must still work.
func (s *soak) worker() {
	var prev string
	for s.errs.Load() < 10 {
		i := int(s.next.Add(1)) - 1
		if i >= s.cycles {
			break
		}
		id, ok := s.create(i)
		if !ok || !s.retry(i, func(ctx context.Context, c *client.Client) error { return soakExec(ctx, c, id) }) {
			return
		}
		if prev != "" && !s.delete(i, prev) {
			return
		}
		prev = id
		s.done.Add(1)
	}
	if prev != "" {
		s.delete(-1, prev)
	}
}

// create creates the sandbox of cycle i.
func (s *soak) create(i int) (string, bool) {
	for s.errs.Load() < 10 {
		c, e := s.client()
		ctx, cancel := waitCtx()
		s.creating.Add(1)
		sb, err := c.CreateSandbox(ctx, soakRequest(i))
		s.creating.Add(-1)
		cancel()
		switch {
		case err == nil:
			s.mu.Lock()
			s.acked[sb.ID] = true
			s.mu.Unlock()
			return sb.ID, true
		case !s.crashed(e):
			s.fail("cycle %d: create: %v", i, err)
			return "", false
		}
	}
	return "", false
}

// delete deletes sandbox id in cycle i.
func (s *soak) delete(i int, id string) bool {
	s.mu.Lock()
	delete(s.acked, id)
	s.deleting[id] = true
	s.mu.Unlock()
	if !s.retry(i, func(ctx context.Context, c *client.Client) error { return c.DeleteSandbox(ctx, id) }) {
		return false
	}
	s.mu.Lock()
	delete(s.deleting, id)
	s.mu.Unlock()
	return true
}

// retry runs call until it succeeds, against the next daemon if a kill
// cut it off.
func (s *soak) retry(i int, call func(context.Context, *client.Client) error) bool {
	for s.errs.Load() < 10 {
		c, e := s.client()
		ctx, cancel := waitCtx()
		err := call(ctx, c)
		cancel()
		switch {
		case err == nil:
			return true
		case !s.crashed(e):
			s.fail("cycle %d: %v", i, err)
			return false
		}
	}
	return false
}

// TestContainerSoakWithCrash runs 2,000 create/exec/delete cycles of
// container sandboxes through the API, 20 at a time, against a `dsec up`
// in a child process that is killed with SIGKILL part way, with creates
// in flight, and started again on the same data directory. After the
// restart every sandbox whose create had returned must be running and
// usable (re-adopted), and the host must hold exactly what the running
// sandboxes need: half-made sandboxes and those whose delete was cut off
// are gone without a trace. Once the soak is done and everything is
// deleted and the daemon stopped, nothing is left: no mount, cgroup,
// network namespace, veth, nftables table or element, or process.
func TestContainerSoakWithCrash(t *testing.T) {
	dir := shortTempDir(t)
	h := newContainerHost(0)
	t.Cleanup(func() { noContainerLeftovers(t, dir, h) })
	cfg := containerConfig(t, dir, h)
	d := startProcDaemon(t, cfg)
	cal := calibrate(t, d.c, h)

	cycles, workers := 2000, 20
	if testing.Short() {
		cycles = 200
	}
	s := newSoak(t, cycles, d.c)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() { defer wg.Done(); s.worker() }()
	}

	// The kill: a third of the way through, with creates in flight.
	for s.done.Load() < int64(cycles/3) || s.creating.Load() < int64(workers/2) {
		if s.errs.Load() > 0 || s.done.Load() >= int64(cycles) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s.down()
	inflight := s.creating.Load()
	d.kill()
	s.mu.Lock()
	acked, deleting := slices.Sorted(maps.Keys(s.acked)), slices.Sorted(maps.Keys(s.deleting))
	s.mu.Unlock()
	killedAt := s.done.Load()
	t.Logf("killed after %d cycles (%v) with %d creates in flight, %d sandboxes up, %d deletes in flight",
		killedAt, time.Since(start).Round(time.Millisecond), inflight, len(acked), len(deleting))

	d = startProcDaemon(t, cfg)
	restarted := time.Now()
	running := settle(t, d.c)
	t.Logf("restarted and reconciled in %v: %d sandboxes running", time.Since(restarted).Round(time.Millisecond), len(running))
	for _, id := range acked {
		if !slices.ContainsFunc(running, func(sb api.Sandbox) bool { return sb.ID == id }) {
			sb, err := d.c.GetSandbox(context.Background(), id)
			t.Errorf("sandbox %s, up before the kill, was not re-adopted: %+v, %v", id, sb, err)
		}
	}
	checkHostMatches(t, dir, h, cal, running)
	checkUsable(t, d.c, running)
	if t.Failed() {
		s.errs.Add(10) // stop the workers
	}
	s.resume(d.c)
	testenv.WaitGroup(t, &wg, 15*time.Minute, "the soak's workers")
	elapsed := time.Since(start)
	t.Logf("%d cycles in %v (%.0f/s) with one crash", s.done.Load(), elapsed.Round(time.Millisecond), float64(s.done.Load())/elapsed.Seconds())
	if t.Failed() {
		return
	}
	if got := s.done.Load(); got != int64(cycles) {
		t.Errorf("%d cycles done, want %d", got, cycles)
	}
	deleteAll(t, d.c, running)
	checkHostMatches(t, dir, h, cal, nil)
	d.stop()
}

// TestContainerCrashDuringCreate kills the daemon three times, each time
// at a random moment while 20 creates are in flight, and checks after
// each restart that the startup sweep removed every half-made sandbox
// (mounts, cgroups, namespaces, veths, nftables elements, processes)
// while the sandboxes whose create returned run on. In the last round the
// restarted daemon is killed again while it recovers.
func TestContainerCrashDuringCreate(t *testing.T) {
	dir := shortTempDir(t)
	h := newContainerHost(1)
	t.Cleanup(func() { noContainerLeftovers(t, dir, h) })
	cfg := containerConfig(t, dir, h)
	d := startProcDaemon(t, cfg)
	cal := calibrate(t, d.c, h)

	var running []api.Sandbox
	for round := range 3 {
		var (
			stop    atomic.Bool
			created atomic.Int64
			wg      sync.WaitGroup
			n       atomic.Int64
		)
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					ctx, cancel := waitCtx()
					_, err := d.c.CreateSandbox(ctx, soakRequest(int(n.Add(1))))
					cancel()
					if err != nil {
						if !stop.Load() {
							t.Errorf("create: %v", err)
						}
						return
					}
					created.Add(1)
				}
			}()
		}
		// Kill somewhere in the first creates: 20 concurrent creates take
		// 0.2-1 s here.
		time.Sleep(time.Duration(100+rand.IntN(900)) * time.Millisecond)
		stop.Store(true)
		d.kill()
		testenv.WaitGroup(t, &wg, 5*time.Minute, "the workers to see the kill")
		if t.Failed() {
			return
		}
		if round == 2 {
			// Killed again while it starts: during recovery, or while the
			// control plane reconciles.
			d = launchProcDaemon(t, cfg)
			time.Sleep(time.Duration(200+rand.IntN(1300)) * time.Millisecond)
			_, served := os.Stat(filepath.Join(dir, AddrFile))
			d.kill()
			t.Logf("killed the restarted daemon again (serving: %v)", served == nil)
		}
		d = startProcDaemon(t, cfg)
		running = settle(t, d.c)
		t.Logf("round %d: %d creates returned before the kill; %d sandboxes running after the restart", round, created.Load(), len(running))
		checkHostMatches(t, dir, h, cal, running)
		checkUsable(t, d.c, running)
		if t.Failed() {
			return
		}
	}
	deleteAll(t, d.c, running)
	checkHostMatches(t, dir, h, cal, nil)
	d.stop()
}

// settle waits until no sandbox is pending or stopping (reconciliation
// after a restart fails interrupted creates and finishes cut-off
// deletes) and returns the running ones.
func settle(t *testing.T, c *client.Client) []api.Sandbox {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var live, running []api.Sandbox
		for _, st := range []api.State{api.StatePending, api.StateStopping, api.StateRunning} {
			l, err := c.ListAllSandboxes(context.Background(), client.ListOptions{State: st})
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, l...)
			if st == api.StateRunning {
				running = l
			}
		}
		if len(live) == len(running) {
			return running
		}
		if time.Now().After(deadline) {
			var left []string
			for _, sb := range live {
				if sb.State != api.StateRunning {
					left = append(left, sb.ID+" "+string(sb.State))
				}
			}
			t.Fatalf("sandboxes not settled 90 s after the restart: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkUsable checks that commands run in every sandbox.
func checkUsable(t *testing.T, c *client.Client, sbs []api.Sandbox) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	for _, sb := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := waitCtx()
			defer cancel()
			if err := soakExec(ctx, c, sb.ID); err != nil {
				t.Errorf("after the restart: %v", err)
			}
		}()
	}
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the checks after the restart")
}

// deleteAll deletes sbs and waits for every delete.
func deleteAll(t *testing.T, c *client.Client, sbs []api.Sandbox) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	for _, sb := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := waitCtx()
			defer cancel()
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("delete %s: %v", sb.ID, err)
			}
		}()
	}
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the deletes")
}

// calibration is how many nftables elements a sandbox of each of
// soakPolicies adds, by set (range shards summed as "allow_any_" and
// "allow_l4_"; the anti-spoofing element, one per namespace, aside).
type calibration [][]elemCount

type elemCount struct {
	set string
	n   int
}

// setGroup names the group a set's elements are counted in.
func setGroup(set string) string {
	for _, p := range []string{"allow_any_", "allow_l4_", "range_"} {
		if strings.HasPrefix(set, p) {
			return p
		}
	}
	return set
}

func groupElems(elems map[string]int) map[string]int {
	out := map[string]int{}
	for set, n := range elems {
		out[setGroup(set)] += n
	}
	return out
}

// calibrate measures, one sandbox at a time, the elements each policy
// adds (they depend on the node's resolvers), and checks that deleting
// the sandbox removes them again.
func calibrate(t *testing.T, c *client.Client, h containerHost) calibration {
	t.Helper()
	ctx := context.Background()
	cal := make(calibration, len(soakPolicies))
	for i := range soakPolicies {
		before, err := testenv.NftElements(h.Net)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := c.CreateSandbox(ctx, soakRequest(i))
		if err != nil {
			t.Fatalf("calibrating: %v", err)
		}
		during, err := testenv.NftElements(h.Net)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		after, err := testenv.NftElements(h.Net)
		if err != nil {
			t.Fatal(err)
		}
		b, d, a := groupElems(before), groupElems(during), groupElems(after)
		for _, set := range slices.Sorted(maps.Keys(d)) {
			if set == "spoof" {
				continue
			}
			if a[set] != b[set] {
				t.Errorf("calibrating policy %d: set %s had %d elements, %d after a create and delete", i, set, b[set], a[set])
			}
			if n := d[set] - b[set]; n != 0 {
				cal[i] = append(cal[i], elemCount{set, n})
			}
		}
	}
	t.Logf("nftables elements per sandbox by policy: %v", cal)
	return cal
}

// hostState is what of a container tier is on the host, by sandbox ID
// where it has one.
type hostState struct {
	cgroups, netns, roots, uppers, dirs, netRecords map[string]bool
	// warm, warmDirs: the warm pool's sandboxes' cgroups and directories
	warm, warmDirs map[string]bool
	links          int
	elems          map[string]int // by setGroup
	procs          []testenv.Proc // running as sandbox ids or in a sandbox cgroup
	other          []string       // anything else of the tier's
}

func readHost(t *testing.T, dir string, h containerHost) hostState {
	t.Helper()
	s := hostState{cgroups: map[string]bool{}, netns: map[string]bool{}, roots: map[string]bool{},
		uppers: map[string]bool{}, dirs: map[string]bool{}, netRecords: map[string]bool{},
		warm: map[string]bool{}, warmDirs: map[string]bool{}}
	for _, l := range testenv.HostLeftovers(h.Sandboxes) {
		kind, what, _ := strings.Cut(l, " ")
		switch kind {
		case "netns":
			s.netns[strings.TrimPrefix(what, h.Net+"-")] = true
		case "link":
			s.links++
		case "cgroup":
			s.cgroups[filepath.Base(what)] = true
		case "warm-cgroup":
			s.warm[filepath.Base(what)] = true
		case "processes", "nftables", "kept-cgroup":
		default:
			s.other = append(s.other, l)
		}
	}
	state := filepath.Join(dir, "node", "container", "sandboxes")
	roots := filepath.Join(dir, "layers", "roots")
	for _, m := range testenv.Mounts(t, dir) {
		switch {
		case filepath.Dir(m) == roots:
			s.roots[filepath.Base(m)] = true
		case filepath.Base(m) == "upper" && filepath.Dir(filepath.Dir(m)) == state:
			s.uppers[filepath.Base(filepath.Dir(m))] = true
		case strings.HasPrefix(m, state+"/"):
			s.other = append(s.other, "mount "+m)
		}
	}
	ents, _ := os.ReadDir(state)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "warm-") {
			s.warmDirs[e.Name()] = true
		} else {
			s.dirs[e.Name()] = true
		}
	}
	recs, _ := filepath.Glob(filepath.Join("/run/dsec/network", h.Net, "*.json"))
	for _, r := range recs {
		s.netRecords[strings.TrimSuffix(filepath.Base(r), ".json")] = true
	}
	elems, err := testenv.NftElements(h.Net)
	if err != nil {
		t.Fatal(err)
	}
	if elems != nil {
		s.elems = groupElems(elems)
	}
	s.procs = testenv.SandboxProcs(h.IDBase, h.IDCount, h.CgroupParent)
	return s
}

// checkHostMatches checks, while the daemon runs, that the host holds
// exactly what the running sandboxes need and the network pool: for each
// sandbox a directory (no root or upper mount), cgroup, network namespace
// and record, veth, its policy's nftables elements and its processes;
// nothing for any other. The kernel removes veths of released
// namespaces, and the pool refills, asynchronously: it waits for that.
func checkHostMatches(t *testing.T, dir string, h containerHost, cal calibration, running []api.Sandbox) {
	t.Helper()
	want := map[string]bool{}
	// Sandboxes without network access have a namespace of their own,
	// made by their clone: no netns of the node's, record or veth.
	wantNet := map[string]bool{}
	wantElems := map[string]int{}
	for _, sb := range running {
		want[sb.ID] = true
		p := policyIndex(sb.Network)
		if p < 0 {
			t.Fatalf("sandbox %s has a policy the test did not ask for: %+v", sb.ID, sb.Network)
		}
		if soakPolicies[p] != nil {
			wantNet[sb.ID] = true
		}
		for _, e := range cal[p] {
			wantElems[e.set] += e.n
		}
	}
	var problems []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := readHost(t, dir, h)
		problems = problems[:0]
		// The warm pool's sandboxes (no network of the node's) come and
		// go on their own: each has its cgroups and directory, no more
		// than the pool holds.
		for what, c := range map[string][2]map[string]bool{
			"cgroups": {s.cgroups, want}, "network namespaces": {s.netns, wantNet},
			"state directories": {s.dirs, want}, "network records": {s.netRecords, wantNet},
			"warm sandboxes' directories": {s.warmDirs, s.warm},
		} {
			if got, w := c[0], c[1]; !maps.Equal(got, w) {
				problems = append(problems, fmt.Sprintf("%s: extra %v, missing %v", what, missingKeys(got, w), missingKeys(w, got)))
			}
		}
		// Roots and uppers live in the sandboxes' own mount namespaces:
		// none is ever left in the host's table.
		for what, got := range map[string]map[string]bool{"root mounts": s.roots, "upper mounts": s.uppers} {
			if len(got) > 0 {
				problems = append(problems, fmt.Sprintf("%s on the host: %v", what, missingKeys(got, nil)))
			}
		}
		if s.links != len(wantNet)+h.Pool {
			problems = append(problems, fmt.Sprintf("%d veths, want %d sandboxes' and %d pooled", s.links, len(wantNet), h.Pool))
		}
		if s.elems == nil {
			problems = append(problems, "no nftables table")
		}
		for set, n := range s.elems {
			w := wantElems[set]
			switch set {
			case "spoof":
				w = len(wantNet) + h.Pool
			case "never", "private", "shards", "uplinks":
				continue
			}
			if n != w {
				problems = append(problems, fmt.Sprintf("nftables set %s: %d elements, want %d", set, n, w))
			}
		}
		guests := map[string]bool{}
		for _, p := range s.procs {
			id := procSandbox(p, h.CgroupParent)
			switch {
			case s.warm[id] && strings.Contains(p.Cmdline, "dsec-guest sandbox"):
				// a warm sandbox's agent
			case !want[id]:
				problems = append(problems, fmt.Sprintf("process of no running sandbox: %v (cgroup %q)", p, id))
			case p.State == 'Z':
				problems = append(problems, fmt.Sprintf("unreaped process of %s: %v", id, p))
			case strings.Contains(p.Cmdline, "dsec-guest sandbox"):
				guests[id] = true
			}
		}
		if len(guests) != len(want) {
			problems = append(problems, fmt.Sprintf("%d sandbox agents run, want %d: missing %v", len(guests), len(want), missingKeys(want, guests)))
		}
		problems = append(problems, s.other...)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			slices.Sort(problems)
			t.Errorf("the host does not match the %d running sandboxes:\n\t%s", len(want), strings.Join(problems, "\n\t"))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procSandbox returns the sandbox whose cgroup (under parent) holds p, or
// "" for none.
func procSandbox(p testenv.Proc, parent string) string {
	for _, line := range strings.Split(p.Cgroups, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			if rest, ok := strings.CutPrefix(parts[2], "/"+parent+"/"); ok {
				id, _, _ := strings.Cut(rest, "/")
				return id
			}
		}
	}
	return ""
}

// missingKeys lists the keys of a missing from b.
func missingKeys(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("… (%d in all)", len(out)))
	}
	return out
}

// noContainerLeftovers checks, once the daemon has stopped, that nothing
// of its container tier is on the host, then removes the empty cgroup
// parents.
func noContainerLeftovers(t *testing.T, dir string, h containerHost) {
	t.Helper()
	testenv.NoHostLeftovers(t, h.Sandboxes)
	testenv.NoMountsUnder(t, dir)
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs := append(testenv.SandboxProcs(h.IDBase, h.IDCount, h.CgroupParent), daemonProcs(dir)...)
		if len(procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("sandbox processes left: %v", procs)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if recs, _ := filepath.Glob(filepath.Join("/run/dsec/network", h.Net, "*")); len(recs) > 0 {
		t.Errorf("network records left: %v", recs)
	}
	if t.Failed() {
		testenv.UnmountAll(dir)
	}
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", h.CgroupParent))
	for _, p := range append(parents, filepath.Join("/sys/fs/cgroup", h.CgroupParent)) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Logf("removing cgroup parent: %v", err)
		}
	}
	_ = os.Remove(filepath.Join("/run/dsec/network", h.Net))
	_ = os.Remove(filepath.Join("/run/dsec/network", h.Net+".lock"))
}

// daemonProcs lists the processes of the test daemons on dir: the
// daemons, and any child they forked that has not exec'd yet (a sandbox
// stuck before it became the agent), which still has their environment.
func daemonProcs(dir string) []testenv.Proc {
	var out []testenv.Proc
	for _, p := range testenv.Procs() {
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.Pid), "environ"))
		if err == nil && strings.Contains(string(env), "DSEC_TEST_DAEMON=") && strings.Contains(string(env), `"DataDir":"`+dir+`"`) {
			out = append(out, p)
		}
	}
	return out
}
