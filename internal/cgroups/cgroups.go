package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Limits are a sandbox's resource limits.
type Limits struct {
	// CPU is the CPU bandwidth in cores (1.5 = 150 ms every 100 ms);
	// 0 means unlimited.
	CPU float64
	// MemoryBytes caps memory (RAM, page cache, kernel memory; no swap);
	// 0 means unlimited.
	MemoryBytes int64
	// Pids caps the tasks (processes and threads) of the sandbox; 0 means
	// DefaultPids, a negative value unlimited.
	Pids int64
	// CPUWeight is the relative CPU share in cgroup v1 cpu.shares units
	// (default 1024; 2–262144); 0 keeps the default. v2 converts it to
	// cpu.weight.
	CPUWeight int
	// AgentMemoryBytes, if positive, sets memory aside for the process
	// that starts the sandbox's commands (v1 and hybrid hosts): the group
	// is limited to MemoryBytes+AgentMemoryBytes and gets a child group in
	// the memory hierarchy, CommandsGroup, limited to MemoryBytes, into
	// which Group.AddCommandThread moves the thread that forks commands.
	// Commands then fill and OOM in the child, where the OOM killer
	// chooses among them only. Ignored on v2 (see AddCommandThread).
	AgentMemoryBytes int64
}

// DefaultPids is the pids limit of a sandbox whose Limits leave it 0.
const DefaultPids = 512

// Mode is a cgroup layout.
type Mode int

const (
	// Detect finds the layout from the mount table.
	Detect Mode = iota
	// V1: controllers are separate v1 hierarchies and there is no cgroup2.
	V1
	// Hybrid: v1 controllers, plus a cgroup2 tree without controllers.
	Hybrid
	// V2: one cgroup2 hierarchy with the controllers.
	V2
)

func (m Mode) String() string {
	return [...]string{"detect", "v1", "hybrid", "v2"}[m]
}

// Options configure a Manager. The zero value is valid.
type Options struct {
	// Parent is the group, relative to each hierarchy's root, under which
	// the sandboxes' groups are made; default "dsec".
	Parent string
	// Logger receives sweep events; default: discarded.
	Logger *slog.Logger
	// PoolSize has no effect. A pool of groups made in advance and
	// renamed by Create was measured and dropped: rename(2) costs about
	// half a mkdir in v1 cgroupfs (65 µs against 134 µs for the four v1
	// hierarchies), cgroup2 refuses rename (EPERM), and Create+AddProc+
	// Destroy did not get measurably faster (RATIONALE.md). Recycle is
	// what saves the work.
	PoolSize int
	// Recycle is how many emptied groups Manager.Recycle keeps for Create
	// to reuse (recycle.go); 0 means DefaultRecycle, negative none.
	Recycle int
	// Root is where the cgroup file systems are mounted; default
	// /sys/fs/cgroup. With Mode V2 it is the cgroup2 mount itself.
	Root string
	// Mode forces a layout instead of detecting it. Tests use it to run
	// the v1 path on a hybrid host (ignoring the unified tree) and the v2
	// path on a separately mounted cgroup2 tree.
	Mode Mode
	// Devices are device rules ("c 10:229 rwm") allowed on top of the
	// default list, on v1 hierarchies with a devices controller.
	Devices []string
}

// Manager makes and finds the groups under one parent. It is safe for
// concurrent use.
type Manager struct {
	mode   Mode
	parent string
	log    *slog.Logger

	// hier are the v1 hierarchies in use, by controller name (two names
	// share a path when co-mounted, e.g. cpu,cpuacct).
	hier map[string]string
	// unified is the cgroup2 mount ("" in v1 mode).
	unified string
	// memsw: the memory hierarchy has memory.memsw.* (swap accounting).
	memsw bool
	// v2ctl are the controllers enabled for the parent's children (v2).
	v2ctl map[string]bool
	// v2swap, v2peak: memory.swap.max and memory.peak exist (v2).
	v2swap, v2peak bool

	recycle int // most groups kept
	// mu guards free (emptied groups kept for reuse, their names those of
	// their first owners) and closed.
	mu     sync.Mutex
	free   []*Group
	closed bool
}

// Controllers in use per layout; the first of each list are required.
var (
	v1Required     = []string{"cpu", "memory", "pids", "freezer"}
	v1Optional     = []string{"cpuacct", "devices"}
	hybridRequired = []string{"cpu", "memory", "pids"}
	hybridOptional = []string{"devices"}
	v2Controllers  = []string{"cpu", "memory", "pids"}
)

// defaultDevices is Docker's default device allow list
// (moby oci/defaults.go): mknod of anything, and access to the pseudo
// devices and terminals a shell needs.
var defaultDevices = []string{
	"c *:* m", "b *:* m",
	"c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", // null zero full random urandom
	"c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", // tty console ptmx
	"c 136:* rwm", // pts
}

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// New detects the cgroup layout, makes the parent group in every
// hierarchy it uses and prepares it (controllers enabled on v2, device
// list on v1). It fails with an error wrapping errdefs.ErrNotSupported if
// a required controller is missing.
func New(ctx context.Context, opt Options) (*Manager, error) {
	if opt.Parent == "" {
		opt.Parent = "dsec"
	}
	if opt.Root == "" {
		opt.Root = "/sys/fs/cgroup"
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	for _, p := range strings.Split(opt.Parent, "/") {
		if !validName.MatchString(p) {
			return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCgroupParent, "cgroup parent %q is not a relative path of plain names", opt.Parent)
		}
	}
	switch {
	case opt.Recycle == 0:
		opt.Recycle = DefaultRecycle
	case opt.Recycle < 0:
		opt.Recycle = 0
	}
	m := &Manager{parent: opt.Parent, log: opt.Logger, hier: map[string]string{}, recycle: opt.Recycle}
	if err := m.detect(filepath.Clean(opt.Root), opt.Mode); err != nil {
		return nil, err
	}
	if err := m.setupParent(opt.Devices); err != nil {
		return nil, err
	}
	return m, nil
}

// detect fills m.mode, m.hier and m.unified from the mount table.
func (m *Manager) detect(root string, force Mode) error {
	mounts, err := sys.MountInfoUnder(root)
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	unified := ""
	for _, e := range mounts {
		switch {
		case e.FSType == "cgroup2" && e.Target == root:
			if force == Detect || force == V2 {
				m.mode, m.unified = V2, root
				return m.detectV2()
			}
		case e.FSType == "cgroup2" && filepath.Dir(e.Target) == root && unified == "":
			unified = e.Target
		case e.FSType == "cgroup" && filepath.Dir(e.Target) == root:
			for _, o := range strings.Split(e.Options, ",") {
				if _, seen := m.hier[o]; !seen && slices.Contains(slices.Concat(v1Required, v1Optional), o) {
					m.hier[o] = e.Target
				}
			}
		}
	}
	required, optional := v1Required, v1Optional
	switch {
	case force == V2:
		return fmt.Errorf("no cgroup2 file system mounted at %s: %w", root, errdefs.ErrNotSupported)
	case force == Hybrid && unified == "":
		return fmt.Errorf("no cgroup2 file system mounted under %s: %w", root, errdefs.ErrNotSupported)
	case force == V1 || unified == "":
		m.mode = V1
	default:
		m.mode, m.unified = Hybrid, unified
		required, optional = hybridRequired, hybridOptional
	}
	for c := range m.hier {
		if !slices.Contains(required, c) && !slices.Contains(optional, c) {
			delete(m.hier, c)
		}
	}
	for _, c := range required {
		if m.hier[c] == "" {
			return fmt.Errorf("no cgroup v1 %s hierarchy mounted under %s: %w", c, root, errdefs.ErrNotSupported)
		}
	}
	_, err = os.Stat(filepath.Join(m.hier["memory"], "memory.memsw.limit_in_bytes"))
	m.memsw = err == nil
	return nil
}

func (m *Manager) detectV2() error {
	b, err := os.ReadFile(filepath.Join(m.unified, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("reading the cgroup2 controllers: %w", err)
	}
	m.v2ctl = map[string]bool{}
	for _, c := range strings.Fields(string(b)) {
		if slices.Contains(v2Controllers, c) {
			m.v2ctl[c] = true
		}
	}
	return nil
}

// setupParent makes the parent group in every hierarchy and prepares it.
func (m *Manager) setupParent(devices []string) error {
	for _, d := range m.hierDirs(m.parent) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("making the cgroup parent: %w", err)
		}
	}
	if m.mode == V2 {
		if err := m.enableV2Controllers(); err != nil {
			return err
		}
		return m.probeV2Files()
	}
	// OOM kills must happen inside the group: oom_kill_disable=1 would
	// instead hang the sandbox at its limit. Children inherit it.
	oom := filepath.Join(m.hier["memory"], m.parent, "memory.oom_control")
	if b, err := os.ReadFile(oom); err != nil {
		return fmt.Errorf("reading the parent's OOM control: %w", err)
	} else if strings.Contains(string(b), "oom_kill_disable 1") {
		if err := writeFile(oom, "0"); err != nil {
			return err
		}
	}
	if dev := m.hier["devices"]; dev != "" {
		return m.setupDevices(filepath.Join(dev, m.parent), append(slices.Clone(defaultDevices), devices...))
	}
	return nil
}

// setupDevices limits the parent's devices to rules. v1 refuses to reset
// the list ("a" on devices.deny) of a group with children, so a parent
// that has them (an agent restart) keeps its list, which an earlier New
// set up the same way.
func (m *Manager) setupDevices(dir string, rules []string) error {
	b, err := os.ReadFile(filepath.Join(dir, "devices.list"))
	if err != nil {
		return fmt.Errorf("reading the parent's device list: %w", err)
	}
	if strings.TrimSpace(string(b)) != "a *:* rwm" {
		return nil // restricted already (by us, before a restart)
	}
	if children, _ := subdirs(dir); len(children) > 0 {
		m.log.Warn("cgroup parent allows every device but has children; leaving its device list", "dir", dir)
		return nil
	}
	if err := writeFile(filepath.Join(dir, "devices.deny"), "a"); err != nil {
		return err
	}
	for _, r := range rules {
		if err := writeFile(filepath.Join(dir, "devices.allow"), r); err != nil {
			return err
		}
	}
	return nil
}

// enableV2Controllers turns the wanted controllers on for the parent's
// children, enabling them on each ancestor first.
func (m *Manager) enableV2Controllers() error {
	if len(m.v2ctl) == 0 {
		return nil
	}
	var want []string
	for _, c := range v2Controllers {
		if m.v2ctl[c] {
			want = append(want, "+"+c)
		}
	}
	dir := m.unified
	for _, p := range append([]string{""}, strings.Split(m.parent, "/")...) {
		dir = filepath.Join(dir, p)
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(want, " ")); err != nil {
			return fmt.Errorf("enabling cgroup2 controllers: %w", err)
		}
	}
	return nil
}

// probeV2Files finds which optional memory files exist (memory.swap.max
// with swap accounting, memory.peak since 5.19); they show on a child only.
func (m *Manager) probeV2Files() error {
	if m.v2ctl["memory"] {
		probe := filepath.Join(m.unified, m.parent, ".probe")
		if err := os.Mkdir(probe, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("probing cgroup2 files: %w", err)
		}
		_, err1 := os.Stat(filepath.Join(probe, "memory.swap.max"))
		_, err2 := os.Stat(filepath.Join(probe, "memory.peak"))
		m.v2swap, m.v2peak = err1 == nil, err2 == nil
		_ = os.Remove(probe)
	}
	return nil
}

// Mode returns the layout in use.
func (m *Manager) Mode() Mode { return m.mode }

// Parent2 returns the parent's cgroup2 directory (where cgroup-bpf
// programs for every sandbox attach), or "" on a v1 host.
func (m *Manager) Parent2() string {
	if m.unified == "" {
		return ""
	}
	return filepath.Join(m.unified, m.parent)
}

// hierDirs returns the directory of the relative group rel in every
// hierarchy in use: v1 ones first (sorted, one per distinct mount), the
// cgroup2 one last.
func (m *Manager) hierDirs(rel string) []string {
	var out []string
	for _, mnt := range m.mounts() {
		out = append(out, filepath.Join(mnt, rel))
	}
	return out
}

// mounts returns the distinct hierarchy mounts in use, cgroup2 last.
func (m *Manager) mounts() []string {
	var out []string
	for _, p := range m.hier {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	if m.unified != "" {
		out = append(out, m.unified)
	}
	return out
}

// group returns the Group named name (an id or a pool entry), without
// touching the file system.
func (m *Manager) group(name string) *Group {
	rel := filepath.Join(m.parent, name)
	g := &Group{m: m, name: name, dirs: m.hierDirs(rel)}
	if m.unified != "" {
		g.unified = filepath.Join(m.unified, rel)
	}
	if m.mode != V2 {
		at := func(c string) string {
			if p := m.hier[c]; p != "" {
				return filepath.Join(p, rel)
			}
			return ""
		}
		g.memory, g.pids, g.cpu, g.cpuacct, g.freezer = at("memory"), at("pids"), at("cpu"), at("cpuacct"), at("freezer")
		if g.memory != "" {
			g.commands = filepath.Join(g.memory, CommandsGroup)
		}
	}
	return g
}

// Create returns group id with limits l, made in every hierarchy or
// renamed from one Recycle kept (callers record its Base to give it back
// after Open). It fails with an error wrapping fs.ErrExist if a group id
// exists, and with errdefs.Unavailable after Close.
func (m *Manager) Create(ctx context.Context, id string, l Limits) (*Group, error) {
	if !validName.MatchString(id) {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCgroupID, "cgroup name %q is not a plain name", id)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := l.check(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, errdefs.New(errdefs.Unavailable, api.CodeCgroupsClosed, "the cgroup manager of %s is closed", m.parent)
	}
	for k := m.takeFree(); k != nil; k = m.takeFree() {
		g, err := m.fromKept(k, id, l)
		if err == nil {
			return g, nil
		}
		if errors.Is(err, fs.ErrExist) {
			m.putBack(k)
			return nil, err
		}
		m.log.Warn("removing a kept cgroup that could not be reused", "name", k.name, "err", err)
		_ = k.rmdirs(context.WithoutCancel(ctx))
	}
	g := m.group(id)
	if err := g.mkdirs(); err != nil {
		return nil, err
	}
	if err := g.apply(l); err != nil {
		_ = g.rmdirs(context.WithoutCancel(ctx)) // empty: nothing was added yet
		return nil, err
	}
	if err := g.readID(); err != nil {
		_ = g.rmdirs(context.WithoutCancel(ctx))
		return nil, err
	}
	return g, nil
}

// Open returns the existing group id (after a node service restart). It
// fails with an error wrapping fs.ErrNotExist unless the group exists in
// every hierarchy.
func (m *Manager) Open(id string) (*Group, error) {
	if !validName.MatchString(id) {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCgroupID, "cgroup name %q is not a plain name", id)
	}
	g := m.group(id)
	for _, d := range g.dirs {
		if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("opening cgroup %s: %w", id, err)
		}
	}
	if err := g.readID(); err != nil {
		return nil, err
	}
	return g, nil
}

// List returns the groups under the parent, in any hierarchy (a group a
// crash left in some hierarchies only is listed too), sorted.
func (m *Manager) List() ([]string, error) {
	var names []string
	for _, d := range m.hierDirs(m.parent) {
		sub, err := subdirs(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue // Close removed the parent: nothing below it
		}
		if err != nil {
			return nil, fmt.Errorf("listing cgroups: %w", err)
		}
		names = append(names, sub...)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Sweep destroys every group under the parent that is not in live: what
// a crashed agent or an earlier run left behind. It returns the errors of
// the groups it could not remove.
func (m *Manager) Sweep(ctx context.Context, live []string) error {
	// Kept groups belong to no sandbox: they go too.
	m.dropFree()
	names, err := m.List()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if slices.Contains(live, n) {
			continue
		}
		m.log.Info("removing stale cgroup", "name", n)
		if err := m.group(n).Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// subdirs lists the directories in dir.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// writeFile writes s to an existing cgroup file in one write(2), which is
// how cgroupfs takes a value.
func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %q to %s: %w", s, path, err)
	}
	return nil
}
