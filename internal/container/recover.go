package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Recovery bounds. Each agent has adoptTimeout to answer: one that does
// not (broken, or hostile: the agent is trusted by nobody) has its
// sandbox removed. Sandboxes are adopted adoptParallel at a time, so that
// slow agents delay the node's start by adoptTimeout, not by that much
// each (one at a time, a hundred frozen agents kept a node from starting
// for 50 minutes, 30 s each: the agent client's call timeout).
// adoptTimeout is a variable for tests.
var adoptTimeout = 10 * time.Second

const adoptParallel = 32

// Recover implements sandbox.Runtime: it re-adopts the sandboxes a
// previous node service left running — their processes, mounts, cgroups and
// network survive it — reconnecting to their agents, and removes what is
// left of sandboxes that died or were half made.
func (r *Runtime) Recover(ctx context.Context) ([]sandbox.Sandbox, error) {
	base := filepath.Join(r.opt.StateDir, "sandboxes")
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	adopted := make([]*Sandbox, len(ents))
	var wg sync.WaitGroup
	sem := make(chan struct{}, adoptParallel)
	for i, e := range ents {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			dir := filepath.Join(base, e.Name())
			actx, cancel := context.WithTimeout(ctx, adoptTimeout)
			sb, err := r.adopt(actx, dir)
			cancel()
			switch {
			case err == nil:
				adopted[i] = sb
			case ctx.Err() != nil:
				// The caller gave up (the node is stopping), not the
				// sandbox: the next start adopts it.
			default:
				r.log.Warn("removing a sandbox that cannot be re-adopted", "sandbox", e.Name(), "err", err)
				r.scrap(context.WithoutCancel(ctx), e.Name(), dir)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		// Sandboxes not adopted for want of time must not be swept.
		for _, sb := range adopted {
			if sb != nil {
				sb.detach()
			}
		}
		return nil, err
	}
	r.mu.Lock()
	for _, sb := range adopted {
		if sb != nil {
			r.sandboxes[sb.id] = sb
			r.owners.hold(sb.state.Owner)
		}
	}
	r.mu.Unlock()
	var out []sandbox.Sandbox
	for _, sb := range adopted {
		if sb == nil {
			continue
		}
		r.watch(sb)
		// The monitor's maps went with the node that set them. A phase
		// whose executables cannot be enforced again fails closed: the
		// sandbox is destroyed, not left running unrestricted.
		if p := sb.commandPhase(); p != nil && p.Executables != nil {
			if err := r.setExecutables(sb, *p); err != nil {
				r.log.Error("destroying an adopted sandbox whose allowed executables cannot be enforced", "sandbox", sb.id, "err", err)
				if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
					r.log.Error("destroying an adopted sandbox", "sandbox", sb.id, "err", err)
				}
				continue
			}
		}
		sb.watchAgent()
		out = append(out, sb)
	}
	// What no adopted sandbox owns goes: networks (namespaces, veths,
	// nftables elements) and cgroups, killing any process left in them,
	// and the sandbox processes that are in no cgroup of theirs.
	live := make([]string, len(out))
	var networked []string // those with a network of the manager's
	for i, sb := range out {
		live[i] = sb.ID()
		if sb.(*Sandbox).hasNetwork() {
			networked = append(networked, sb.ID())
		}
	}
	// A sweep that fails leaves strays (logged) but does not fail the
	// recovery: the node must still start and serve the sandboxes it
	// adopted, which run whatever the sweep left. Sandboxes without
	// network access have no network there: naming them would make
	// Recover report their (absent) networks as lost.
	if err := r.opt.Network.Recover(ctx, networked); err != nil {
		r.log.Error("sweeping networks no sandbox owns", "err", err)
	}
	if err := r.opt.Cgroups.Sweep(ctx, live); err != nil {
		r.log.Error("sweeping cgroups no sandbox owns", "err", err)
	}
	// And the first processes that never joined their cgroups (strays.go).
	keep := map[int]bool{}
	for _, sb := range out {
		keep[sb.(*Sandbox).state.Pid] = true
	}
	r.sweepStrays(keep)
	return out, nil
}

// adopt takes over one sandbox after a restart.
func (r *Runtime) adopt(ctx context.Context, dir string) (*Sandbox, error) {
	st, err := readState(dir)
	if err != nil {
		return nil, err
	}
	if st.Warm {
		return nil, errors.New("it was a warm sandbox, never claimed")
	}
	// (A sandbox without network access has its own namespace: no
	// endpoint.)
	if _, ok := r.opt.Network.Endpoint(st.Spec.ID); !ok && st.Netns != "" {
		return nil, errors.New("its network is gone")
	}
	cg, err := r.opt.Cgroups.Open(st.Spec.ID)
	if err != nil {
		return nil, err
	}
	cg.SetBase(st.CgroupBase)
	// Its first process must still be in its cgroup (a pid alone may have
	// been reused).
	if procs, err := cg.Procs(); err != nil || !slices.Contains(procs, st.Pid) {
		return nil, errors.New("its first process is gone")
	}
	// The agent answers before the root is taken over: releasing a root
	// unmounts it, which must not happen to a sandbox that runs on (one
	// whose adoption the caller cancelled).
	client, err := agentsandbox.Dial(ctx, filepath.Join(dir, "sock", setup.SockName), r.log, nil)
	if err != nil {
		return nil, err
	}
	// Its root lives in its own mount namespace; the cache keeps its
	// layers for it.
	releaseRoot, err := r.opt.Layers.Hold(ctx, st.Spec.Image.Layers)
	if err != nil {
		client.Close()
		return nil, err
	}
	pid := st.Pid
	sb := &Sandbox{rt: r, id: st.Spec.ID, dir: dir, state: st, agent: agentsandbox.NewAgent(Tier, st.Spec.ID, client), cg: cg,
		wait: func() { waitGone(pid) }, releaseRoot: releaseRoot}
	if err := sb.openExitWatch(); err != nil {
		client.Close()
		releaseRoot()
		return nil, err
	}
	return sb, nil
}

// scrap removes whatever is left of a sandbox: its processes (through its
// cgroup), root, upper, network and cgroups, best effort.
func (r *Runtime) scrap(ctx context.Context, id, dir string) {
	if cg, err := r.opt.Cgroups.Open(id); err == nil {
		_ = cg.Kill(ctx)
		_ = cg.Destroy(ctx)
	}
	// A crash between mounting the upper and detaching it leaves it in
	// the host's table.
	_ = sys.Unmount(filepath.Join(dir, "upper"))
	_ = r.opt.Network.Release(ctx, id)
	_ = os.RemoveAll(dir)
}

// alive reports whether pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := sys.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// waitGone waits for an adopted sandbox's first process, which is not our
// child, to disappear (its cgroup was killed just before).
func waitGone(pid int) {
	for i := 0; i < 2000 && alive(pid); i++ {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && len(b) > 0 && zombie(b) {
			return
		}
		sleepBrief()
	}
}
