package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Group is one sandbox's control group, a directory in every hierarchy
// the Manager uses. Its methods may be called concurrently, except
// Destroy, after which the Group must not be used.
type Group struct {
	m    *Manager
	name string
	// dirs is the group's directory in every hierarchy, cgroup2 last.
	dirs []string
	// The directories of single controllers ("" where not in use) and
	// the cgroup2 directory ("" in v1 mode).
	memory, pids, cpu, cpuacct, freezer string
	unified                             string
	// commands is the memory group's child for commands (see
	// Limits.AgentMemoryBytes; "" on v2), which may not exist.
	commands string
	id       uint64
	// limits were applied last; base: see Counters.
	limits Limits
	base   Counters
}

// Name returns the group's name under the parent (the sandbox id).
func (g *Group) Name() string { return g.name }

// ID returns the cgroup2 id of the group (its unified directory's inode
// number, what bpf_get_current_cgroup_id() returns for its tasks), or 0
// on a v1 host.
func (g *Group) ID() uint64 { return g.id }

// Path2 returns the group's cgroup2 directory (for cgroup-bpf attach), or
// "" on a v1 host.
func (g *Group) Path2() string { return g.unified }

// Dirs returns the group's directory in every hierarchy.
func (g *Group) Dirs() []string { return append([]string(nil), g.dirs...) }

// mkdirs makes the group's directories; if one fails it removes those it
// made.
func (g *Group) mkdirs() error {
	for i, d := range g.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			for _, made := range g.dirs[:i] {
				_ = os.Remove(made) // empty, just made
			}
			return fmt.Errorf("making cgroup %s: %w", g.name, err)
		}
	}
	return nil
}

func (g *Group) readID() error {
	if g.unified == "" {
		return nil
	}
	id, err := sys.CgroupID(g.unified)
	if err != nil {
		return err
	}
	g.id = id
	return nil
}

// apply writes the limits.
func (g *Group) apply(l Limits) error {
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	if err := l.check(); err != nil {
		return err
	}
	var err error
	if g.m.mode == V2 {
		err = g.applyV2(l)
	} else {
		err = g.applyV1(l)
	}
	if err == nil {
		g.limits = l
	}
	return err
}

// SetBase sets the counters a group that Open found was handed to its
// owner with (the Base its Create returned), which Stats subtracts.
func (g *Group) SetBase(c Counters) { g.base = c }

func (l Limits) check() error {
	if l.CPU < 0 || l.MemoryBytes < 0 || l.AgentMemoryBytes < 0 || l.CPUWeight < 0 || l.CPUWeight > 262144 {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidLimits, "invalid cgroup limits %+v", l)
	}
	return nil
}

// cfsPeriod is the CFS bandwidth period, in µs (the kernel default).
const cfsPeriod = 100000

func cpuQuota(cores float64) int64 {
	return max(int64(cores*cfsPeriod), 1000) // the kernel's minimum is 1 ms
}

func (g *Group) applyV1(l Limits) error {
	var w writes
	if l.MemoryBytes > 0 {
		g.memoryLimit(&w, g.memory, l.MemoryBytes+l.AgentMemoryBytes)
	}
	if l.AgentMemoryBytes > 0 && w.err == nil {
		w.err = g.makeCommands()
		if l.MemoryBytes > 0 {
			g.memoryLimit(&w, g.commands, l.MemoryBytes)
		}
	}
	if l.Pids > 0 {
		w.add(g.pids, "pids.max", strconv.FormatInt(l.Pids, 10))
	}
	if l.CPU > 0 {
		w.add(g.cpu, "cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(l.CPU), 10))
	}
	if l.CPUWeight > 0 {
		w.add(g.cpu, "cpu.shares", strconv.Itoa(max(l.CPUWeight, 2)))
	}
	return w.err
}

// memoryLimit limits the v1 memory group dir to n bytes.
func (g *Group) memoryLimit(w *writes, dir string, n int64) {
	v := strconv.FormatInt(n, 10)
	w.add(dir, "memory.limit_in_bytes", v)
	if g.m.memsw {
		// memsw counts RAM+swap: equal to the RAM limit, no swap.
		w.add(dir, "memory.memsw.limit_in_bytes", v)
	}
}

func (g *Group) applyV2(l Limits) error {
	ctl := g.m.v2ctl
	need := func(c string) error {
		if !ctl[c] {
			return fmt.Errorf("cgroup2 %s controller not enabled: %w", c, errdefs.ErrNotSupported)
		}
		return nil
	}
	var w writes
	d := g.unified
	if ctl["memory"] {
		// Always, even without a limit: no swap, and an OOM kill takes the
		// whole sandbox down rather than leaving it half-dead.
		if g.m.v2swap {
			w.add(d, "memory.swap.max", "0")
		}
		w.add(d, "memory.oom.group", "1")
	}
	if l.MemoryBytes > 0 {
		if err := need("memory"); err != nil {
			return err
		}
		w.add(d, "memory.max", strconv.FormatInt(l.MemoryBytes, 10))
	}
	if l.Pids > 0 {
		if err := need("pids"); err != nil {
			return err
		}
		w.add(d, "pids.max", strconv.FormatInt(l.Pids, 10))
	}
	if l.CPU > 0 || l.CPUWeight > 0 {
		if err := need("cpu"); err != nil {
			return err
		}
	}
	if l.CPU > 0 {
		w.add(d, "cpu.max", fmt.Sprintf("%d %d", cpuQuota(l.CPU), cfsPeriod))
	}
	if l.CPUWeight > 0 {
		w.add(d, "cpu.weight", strconv.Itoa(sharesToWeight(l.CPUWeight)))
	}
	return w.err
}

// sharesToWeight maps v1 cpu.shares [2, 262144] onto v2 cpu.weight
// [1, 10000] with runc's formula (1024 → 39; the scales are not
// proportional, only monotonic).
func sharesToWeight(shares int) int {
	shares = max(shares, 2)
	return 1 + ((shares-2)*9999)/262142
}

// writes collects cgroup file writes, stopping at the first error.
type writes struct{ err error }

func (w *writes) add(dir, file, value string) {
	if w.err == nil {
		w.err = writeFile(filepath.Join(dir, file), value)
	}
}

// AddProc moves the process pid (all its threads) into the group in every
// hierarchy: the cgroup2 group first, so that Kill reaches it even if a v1
// write fails. On error the process may be in some hierarchies only; the
// caller kills it (it has not been released yet) and destroys the group.
func (g *Group) AddProc(pid int) error {
	if pid <= 0 {
		// "0" would move the caller itself into the sandbox's group.
		return errdefs.New(errdefs.Invalid, api.CodeInvalidPid, "pid %d", pid)
	}
	s := strconv.Itoa(pid)
	for i := len(g.dirs) - 1; i >= 0; i-- {
		if err := writeFile(filepath.Join(g.dirs[i], "cgroup.procs"), s); err != nil {
			return fmt.Errorf("adding process %d to cgroup %s: %w", pid, g.name, err)
		}
	}
	return nil
}

// procsDir is where the group's member list is read: the cgroup2 group if
// there is one, the memory group otherwise.
func (g *Group) procsDir() string {
	if g.unified != "" {
		return g.unified
	}
	return g.memory
}

// Procs returns the pids of the group's processes.
func (g *Group) Procs() ([]int, error) {
	return readProcs(g.procsDir())
}

func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("reading cgroup processes: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("reading cgroup processes: %q: %w", f, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// Stats are a group's resource counters. Fields a layout cannot provide
// stay 0.
type Stats struct {
	MemoryBytes int64   // memory in use now, page cache included
	MemoryPeak  int64   // the highest MemoryBytes so far
	CPUSeconds  float64 // CPU time used by the group's tasks
	Pids        int64   // tasks now (processes and threads, zombies until reaped)
	PidsLimited int64   // forks refused at pids.max
	OOMKills    int64   // tasks the OOM killer killed in the group
	Frozen      bool    // the group is frozen
}

// Stats reads the group's counters.
func (g *Group) Stats() (Stats, error) {
	var st Stats
	var r reads
	if g.m.mode == V2 {
		d := g.unified
		if g.m.v2ctl["memory"] {
			st.MemoryBytes = r.int(d, "memory.current")
			if g.m.v2peak {
				st.MemoryPeak = r.int(d, "memory.peak")
			}
			st.OOMKills = r.key(d, "memory.events", "oom_kill")
		}
		if g.m.v2ctl["pids"] {
			st.Pids = r.int(d, "pids.current")
			st.PidsLimited = r.key(d, "pids.events", "max")
		}
	} else {
		st.MemoryBytes = r.int(g.memory, "memory.usage_in_bytes")
		st.MemoryPeak = r.int(g.memory, "memory.max_usage_in_bytes")
		st.OOMKills = r.key(g.memory, "memory.oom_control", "oom_kill") + g.commandsOOMKills()
		st.Pids = r.int(g.pids, "pids.current")
		st.PidsLimited = r.key(g.pids, "pids.events", "max")
		if g.cpuacct != "" {
			st.CPUSeconds = float64(r.int(g.cpuacct, "cpuacct.usage")) / 1e9
		}
	}
	if g.unified != "" {
		// cgroup2 counts CPU time and freezes without any controller.
		st.CPUSeconds = float64(r.key(g.unified, "cpu.stat", "usage_usec")) / 1e6
		st.Frozen = r.key(g.unified, "cgroup.events", "frozen") == 1
	} else if g.freezer != "" {
		st.Frozen = strings.TrimSpace(r.str(g.freezer, "freezer.state")) == "FROZEN"
	}
	// What accrued since the group's current owner got it (Recycle).
	b := g.base
	st.CPUSeconds = max(st.CPUSeconds-float64(b.CPUNanos)/1e9, 0)
	st.OOMKills = max(st.OOMKills-b.OOMKills, 0)
	st.PidsLimited = max(st.PidsLimited-b.PidsLimited, 0)
	return st, r.err
}

// reads collects cgroup file reads, keeping the first error.
type reads struct{ err error }

func (r *reads) str(dir, file string) string {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("reading cgroup stats: %w", err)
	}
	return string(b)
}

func (r *reads) int(dir, file string) int64 {
	s := strings.TrimSpace(r.str(dir, file))
	if s == "" || s == "max" {
		return 0
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("reading cgroup stats: %s: %w", file, err)
	}
	return v
}

// key reads the value of "key value" lines (memory.events, cpu.stat…).
func (r *reads) key(dir, file, key string) int64 {
	return keyValue(r.str(dir, file), key)
}

// keyValue returns the value of key in "key value" lines, or 0.
func keyValue(s, key string) int64 {
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Destroy kills the group's processes and removes the group from every
// hierarchy. A group that is already (partly) gone is not an error.
func (g *Group) Destroy(ctx context.Context) error {
	if err := g.Kill(ctx); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return g.rmdirs(ctx)
}

// rmdirs removes the group's directories, cgroup2 first. A directory
// whose last task is still exiting refuses rmdir with EBUSY for a moment;
// that is retried until ctx ends (or 2 s). A busy v1 directory has its
// members killed first (see Kill).
func (g *Group) rmdirs(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, 2*time.Second)
	defer cancel()
	var errs []error
	dirs := g.dirs
	if g.commands != "" {
		// A memory group with a child is busy until the child goes.
		i := slices.Index(dirs, g.memory)
		dirs = slices.Insert(slices.Clone(dirs), i+1, g.commands)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		err := retry(ctx, func() (bool, error) {
			err := os.Remove(d)
			switch {
			case err == nil || errors.Is(err, fs.ErrNotExist):
				return true, nil
			case !sys.IsBusy(err):
				return true, err
			case d != g.unified:
				if kerr := g.killV1(ctx, d); kerr != nil {
					return false, errors.Join(err, kerr)
				}
			}
			return false, err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", g.name, err))
		}
	}
	return errors.Join(errs...)
}

// withDefaultTimeout bounds ctx by d unless it has a deadline already.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// retry calls f until it reports done, backing off from 50 µs to 10 ms.
// When ctx ends first it returns f's last error joined with ctx's.
func retry(ctx context.Context, f func() (done bool, err error)) error {
	wait := 50 * time.Microsecond
	for {
		done, err := f()
		if done {
			return err
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
			}
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Millisecond)
	}
}
