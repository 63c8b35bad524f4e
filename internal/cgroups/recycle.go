package cgroups

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Recycling. Making a sandbox's groups and removing them was the largest
// share of a create → destroy cycle's CPU here: the mkdirs and rmdirs
// (≈ 0.6 ms in the node, contended on the cgroup mutex) and the kernel's
// deferred work on removal (css offlining, memcg reparenting, ≈ 0.5 ms in
// kworkers), nearly all of it the v1 controllers'. A destroyed sandbox's
// v1 groups, once empty, are renamed to "kept-<random>" and kept for the
// next Create, which renames them to its id (≈ 15 µs each) and writes
// only the limits that differ. A group's name stays its sandbox's id.
// The cgroup2 directory (hybrid hosts: no controllers, cheap to make) is
// made new for each owner, so a sandbox's cgroup2 id (its eBPF identity)
// is never an earlier sandbox's. Pure v2 hosts do not recycle: cgroup2
// directories cannot be renamed.
//
// What a group carries over, and how it is made harmless:
//   - tasks: none; a group is kept only when Kill found it empty and
//     pids.current is 0 (no zombie holds a pid either);
//   - limits: rewritten where they differ from the last ones applied;
//   - freezing: the cgroup2 directory, whose freezer hybrid hosts use, is
//     new; a v1 freezer is thawed;
//   - cumulative counters (OOM kills, forks refused, v1 CPU time): read
//     as the group's Base and subtracted by Stats; the memory high-water
//     mark is reset;
//   - memory charged to it: the page cache of files the last sandbox
//     read stays charged (reclaimable; its own memory went with its
//     tasks and upper). A group holding more than recycleMaxMemory is
//     removed instead, which hands the charge to the parent.
//
// Sandboxes cannot read or write their group's files (/sys/fs/cgroup is
// masked), so none of this is visible from inside.

// DefaultRecycle is how many empty groups a Manager keeps by default.
const DefaultRecycle = 64

// recycleMaxMemory bounds the memory a group may still have charged to be
// reused.
const recycleMaxMemory = 32 << 20

// Counters are a group's cumulative counters at the time it was handed to
// its current owner: Stats reports what accrued since. A runtime keeps
// them with the sandbox's record and gives them back (SetBase) to the
// group Open returns.
type Counters struct {
	CPUNanos    int64 `json:"cpu_ns,omitempty"`
	OOMKills    int64 `json:"oom_kills,omitempty"`
	PidsLimited int64 `json:"pids_limited,omitempty"`
}

// Base returns the counters the group had when Create handed it out.
func (g *Group) Base() Counters { return g.base }

// Recycle kills the group's tasks and keeps the group for a later Create
// if it is fit for one (see above) and the Manager has room; otherwise it
// removes it, as Destroy does. The Group must not be used afterwards.
func (m *Manager) Recycle(ctx context.Context, g *Group) error {
	if err := g.Kill(ctx); err != nil {
		return err
	}
	if !m.keep(g) {
		return g.rmdirs(ctx)
	}
	return nil
}

// keepPrefix starts the names of kept groups.
const keepPrefix = "kept-"

// keep resets g, renames it and adds it to the free list, reporting
// whether it did; if not, g's directories are still under its name.
func (m *Manager) keep(g *Group) bool {
	m.mu.Lock()
	full := len(m.free) >= m.recycle || m.closed
	m.mu.Unlock()
	if full || m.mode == V2 {
		return false
	}
	base, ok := g.reset()
	if !ok {
		return false
	}
	if g.unified != "" {
		if err := os.Remove(g.unified); err != nil {
			return false
		}
	}
	kept, err := m.rename(g, keepPrefix+randomHex(8))
	if err != nil {
		m.log.Warn("keeping a cgroup", "name", g.name, "err", err)
		return false
	}
	kept.base, kept.limits = base, g.limits
	m.mu.Lock()
	if len(m.free) < m.recycle && !m.closed {
		m.free = append(m.free, kept)
		kept = nil
	}
	m.mu.Unlock()
	if kept != nil {
		_ = kept.rmdirs(context.Background())
	}
	return true
}

// rename moves g's v1 directories to name (undoing what it did if one
// fails) and returns the group under it, without a cgroup2 directory.
func (m *Manager) rename(g *Group, name string) (*Group, error) {
	n := m.group(name)
	n.unified = ""
	for i, d := range g.v1Dirs() {
		to := n.v1Dirs()[i]
		if err := os.Rename(d, to); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = os.Rename(n.v1Dirs()[j], g.v1Dirs()[j])
			}
			return nil, fmt.Errorf("renaming cgroup %s to %s: %w", g.name, name, err)
		}
	}
	n.dirs = n.v1Dirs()
	return n, nil
}

// v1Dirs are the group's v1 directories (all but the cgroup2 one).
func (g *Group) v1Dirs() []string {
	var out []string
	for _, d := range g.dirs {
		if g.m.unified == "" || !strings.HasPrefix(d, g.m.unified+"/") {
			out = append(out, d)
		}
	}
	return out
}

// fromKept makes group id out of the kept group k with limits l.
func (m *Manager) fromKept(k *Group, id string, l Limits) (*Group, error) {
	g, err := m.rename(k, id)
	if err != nil {
		return nil, err
	}
	g = m.group(id)
	g.base, g.limits = k.base, k.limits
	if g.unified != "" {
		if err := os.Mkdir(g.unified, 0o755); err != nil {
			_ = g.rmdirs(context.Background())
			return nil, fmt.Errorf("making cgroup %s: %w", id, err)
		}
	}
	if err := g.reuse(l); err != nil {
		_ = g.rmdirs(context.Background())
		return nil, err
	}
	if err := g.readID(); err != nil {
		_ = g.rmdirs(context.Background())
		return nil, err
	}
	return g, nil
}

// putBack returns k to the free list.
func (m *Manager) putBack(k *Group) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		go func() { _ = k.rmdirs(context.Background()) }()
		return
	}
	m.free = append(m.free, k)
}

// takeFree returns a kept group, or nil.
func (m *Manager) takeFree() *Group {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.free)
	if n == 0 {
		return nil
	}
	g := m.free[n-1]
	m.free = m.free[:n-1]
	return g
}

// reset readies an empty v1 group for another owner and returns its
// counters; ok is false if the group should be removed instead.
func (g *Group) reset() (c Counters, ok bool) {
	var r reads
	if !g.noPids() || r.int(g.memory, "memory.usage_in_bytes") > recycleMaxMemory {
		return c, false
	}
	c.OOMKills = r.key(g.memory, "memory.oom_control", "oom_kill") + g.commandsOOMKills()
	c.PidsLimited = r.key(g.pids, "pids.events", "max")
	if g.cpuacct != "" {
		c.CPUNanos = r.int(g.cpuacct, "cpuacct.usage")
	}
	if r.err == nil {
		r.err = writeFile(filepath.Join(g.memory, "memory.max_usage_in_bytes"), "0")
	}
	// (A cgroup2 directory, hybrid hosts' freezer, is made new for the
	// next owner.)
	if g.unified == "" && g.freezer != "" && strings.TrimSpace(r.str(g.freezer, "freezer.state")) != "THAWED" && r.err == nil {
		r.err = writeFile(filepath.Join(g.freezer, "freezer.state"), "THAWED")
	}
	return c, r.err == nil
}

// noPids waits a little for the group's pids count to reach 0: after
// Kill, tasks are gone from the group but a zombie whose parent is
// outside it still holds a pid until reaped. A runtime that waited for
// its sandbox's processes to be reaped never waits here.
func (g *Group) noPids() bool {
	dir := g.pids
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := retry(ctx, func() (bool, error) {
		var r reads
		n := r.int(dir, "pids.current")
		return r.err != nil || n == 0, r.err
	})
	return err == nil
}

// Update changes the group's limits to l (a warm sandbox's, when it is
// claimed).
func (g *Group) Update(l Limits) error {
	if err := l.check(); err != nil {
		return err
	}
	return g.reuse(l)
}

// reuse applies l to a kept group: nothing if its last limits were the
// same, else the old ones lifted and l applied.
func (g *Group) reuse(l Limits) error {
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	if l == g.limits {
		return nil
	}
	if err := g.lift(g.limits, l); err != nil {
		return err
	}
	return g.apply(l)
}

// lift removes the limits of old that n does not set (apply writes only
// those it sets) or raises (v1's memsw limit must stay at or above the
// RAM limit, so a raise starts from none).
func (g *Group) lift(old, n Limits) error {
	var w writes
	if g.m.mode == V2 {
		d := g.unified
		if old.MemoryBytes > 0 && n.MemoryBytes == 0 {
			w.add(d, "memory.max", "max")
		}
		if old.Pids > 0 && n.Pids < 0 {
			w.add(d, "pids.max", "max")
		}
		if old.CPU > 0 && n.CPU == 0 {
			w.add(d, "cpu.max", "max "+strconv.Itoa(cfsPeriod))
		}
		if old.CPUWeight > 0 && n.CPUWeight == 0 {
			w.add(d, "cpu.weight", "100")
		}
		return w.err
	}
	if o, n := old.groupMemory(), n.groupMemory(); o > 0 && (n == 0 || n > o) {
		g.liftMemory(&w, g.memory)
	}
	if o, n := old.commandsMemory(), n.commandsMemory(); o > 0 && (n == 0 || n > o) {
		g.liftMemory(&w, g.commands)
	}
	if old.Pids > 0 && n.Pids < 0 {
		w.add(g.pids, "pids.max", "max")
	}
	if old.CPU > 0 && n.CPU == 0 {
		w.add(g.cpu, "cpu.cfs_quota_us", "-1")
	}
	if old.CPUWeight > 0 && n.CPUWeight == 0 {
		w.add(g.cpu, "cpu.shares", "1024")
	}
	return w.err
}

// liftMemory removes the v1 memory group dir's limits.
func (g *Group) liftMemory(w *writes, dir string) {
	if g.m.memsw {
		w.add(dir, "memory.memsw.limit_in_bytes", "-1")
	}
	w.add(dir, "memory.limit_in_bytes", "-1")
}

// Close removes the groups kept for reuse, then the parent in every
// hierarchy where no group is left below it: a node stopped without
// sandboxes leaves nothing of its own in the cgroup trees, while one that
// keeps sandboxes keeps the parent (and the device list New set on it)
// for them. Only the last element of a nested Parent goes; its ancestors
// may be shared. Groups in use are left alone; Recycle removes groups
// from then on, and Create fails.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	free := m.free
	m.free, m.closed = nil, true
	m.mu.Unlock()
	var errs []error
	for _, g := range free {
		if err := g.rmdirs(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing kept cgroups: %w", errors.Join(errs...))
	}
	return m.removeParent()
}

// removeParent removes the parent's directory in every hierarchy that
// has no group below it. One with a group (a kept sandbox's) stays, and
// so does one a task still sits in (EBUSY): neither is an error.
func (m *Manager) removeParent() error {
	var errs []error
	for _, d := range m.hierDirs(m.parent) {
		if sub, err := subdirs(d); err != nil || len(sub) > 0 {
			continue // gone already, or in use
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !sys.IsBusy(err) {
			errs = append(errs, fmt.Errorf("removing the cgroup parent: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Kept returns the names of the groups kept for reuse.
func (m *Manager) Kept() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.free))
	for i, g := range m.free {
		out[i] = g.name
	}
	return out
}

// dropFree forgets the kept groups (Sweep removes them as strays).
func (m *Manager) dropFree() {
	m.mu.Lock()
	m.free = nil
	m.mu.Unlock()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Rename gives group g the name id (a warm sandbox's, when it is
// claimed) and returns it under that name; g must not be used after.
// v1 directories are renamed; a cgroup2 one cannot be, so a new one is
// made, g's processes moved into it and the old one removed (on v2, the
// new one gets g's limits first). It fails with an error wrapping
// fs.ErrExist if a group id exists.
func (m *Manager) Rename(ctx context.Context, g *Group, id string) (*Group, error) {
	if !validName.MatchString(id) {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCgroupID, "cgroup name %q is not a plain name", id)
	}
	n := m.group(id)
	if n.unified != "" {
		if err := os.Mkdir(n.unified, 0o755); err != nil {
			return nil, fmt.Errorf("making cgroup %s: %w", id, err)
		}
	}
	undo := func() {
		if n.unified != "" {
			_ = os.Remove(n.unified)
		}
	}
	if m.mode == V2 {
		if err := n.apply(g.limits); err != nil {
			undo()
			return nil, err
		}
	}
	if _, err := m.rename(g, id); err != nil {
		undo()
		return nil, err
	}
	n.base, n.limits = g.base, g.limits
	if g.unified != "" {
		// Renamed, the v1 directories are n's: from here on, failing
		// leaves the caller n to destroy.
		pids, err := readProcs(g.unified)
		for _, pid := range pids {
			if err == nil {
				err = writeFile(filepath.Join(n.unified, "cgroup.procs"), strconv.Itoa(pid))
				if errors.Is(err, syscall.ESRCH) {
					err = nil // it exited meanwhile: nothing to move
				}
			}
		}
		if err == nil {
			err = retry(ctx, func() (bool, error) {
				err := os.Remove(g.unified)
				return err == nil || !sys.IsBusy(err), err
			})
		}
		if err != nil {
			// The old cgroup2 directory is n's to remove, with its own
			// (a warm sandbox whose agent died left it behind).
			n.dirs = append(n.dirs, g.unified)
			return n, fmt.Errorf("moving cgroup %s to %s: %w", g.name, id, err)
		}
	}
	if err := n.readID(); err != nil {
		return n, err
	}
	return n, nil
}
