// Package container is the container tier: DSec's own runtime for a full
// Linux userspace per sandbox, in Go, without runc or crun. A sandbox is
// dsec-guest (from the read-only toolkit layer) started by the node in new
// user, mount, pid, uts, ipc and cgroup namespaces, joined to a network
// namespace the node made, placed in its cgroups, over an overlay root of
// id-mapped image layers with a size-capped tmpfs upper. The guest builds
// its view of /proc, /dev and /sys, pivots into the root, empties its
// capability bounding set, installs the seccomp filter and becomes the
// agent the node drives over a unix socket. Everything the sandbox must
// not do is enforced from the host: namespaces, the id map, cgroups,
// nftables, mount flags; the agent is trusted by nobody.
package container

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Tier is this runtime's tier name.
const Tier = api.TierContainer

// DefaultIDBase is the host uid and gid sandbox root maps to by default.
const DefaultIDBase = 1000000

// GuestPath is where images hold the agent (the toolkit/dsec-guest layer).
const GuestPath = "opt/dsec/bin/dsec-guest"

// Options configure the runtime. Zero values are valid except the
// dependencies.
type Options struct {
	// StateDir holds sandboxes (sandboxes/<id>/).
	StateDir string
	// Reach are the directories holding what sandboxes must reach before
	// they pivot into their roots (the layer cache): see reachable.
	// StateDir is always included.
	Reach []string
	// DataDir is the node's data directory: directories in it that Reach
	// needs are given search permission for others; those above it must
	// have it already.
	DataDir string
	Layers  layerRoots
	Network networks
	Cgroups cgroupManager
	// Seccomp compiles the filter for a set of kept capabilities; nil
	// means no filter (tests of the filter's absence only).
	Seccomp func(keepCaps []string) ([]byte, error)
	Logger  *slog.Logger
	// IDs: sandbox root is host HostUID/HostGID, and the sandbox owns
	// IDCount ids from there (default 1000000, 1000000, 65536).
	HostUID, HostGID, IDCount int
	// ReadyTimeout bounds a sandbox's start (default 30 s).
	ReadyTimeout time.Duration
	// NoZygote makes the node fork sandboxes itself instead of through
	// `dsec-guest zygote` (see guest.Zygote): slower the more sandboxes
	// run, for tests and comparisons.
	NoZygote bool
	// Version is passed to the agent.
	Version string
	// Pids is the default pids limit (512).
	Pids int64
	// Nofile is RLIMIT_NOFILE inside sandboxes: default 65536, and never
	// above the node's own hard limit (raising that needs
	// CAP_SYS_RESOURCE, which root lacks on some hosts, this one included).
	Nofile uint64
	// Monitor, if set, watches every sandbox from its create (or
	// adoption) to its destroy.
	Monitor watcher
	// Exec, if set, enforces phases' allowed executables (the eBPF
	// monitor); without it a sandbox with any is refused
	// (executables_unenforced).
	Exec execGuard
	// Warm is how many sandboxes the warm pool keeps started for each of
	// the last images asked for, without network access (warm.go); 0:
	// no pool.
	Warm int
	// WarmAgents is how many idle agents, which take any image's root
	// when claimed, are kept started for each agent binary in use
	// (idle.go); 0: none.
	WarmAgents int
	// PhaseTimeout bounds a phase change's freeze and the end of the
	// earlier phase's processes; 0 means 30 s.
	PhaseTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.HostUID == 0 {
		o.HostUID = DefaultIDBase
	}
	if o.HostGID == 0 {
		o.HostGID = DefaultIDBase
	}
	if o.IDCount == 0 {
		o.IDCount = 65536
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.Pids == 0 {
		o.Pids = 512
	}
	if o.PhaseTimeout == 0 {
		o.PhaseTimeout = 30 * time.Second
	}
	if o.Nofile == 0 {
		o.Nofile = 65536
	}
	var lim syscall.Rlimit
	if err := sys.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Max < o.Nofile {
		o.Nofile = lim.Max
	}
	return o
}

// Runtime runs container sandboxes. It is safe for concurrent use.
type Runtime struct {
	opt Options
	log *slog.Logger

	forker *forker

	zmu          sync.Mutex // guards the following fields
	zygote       *zygote
	zygoteFailed bool // it could not start: the node forks itself

	smu      sync.Mutex        // guards following fields
	seccomps map[string][]byte // compiled filters by kept capabilities

	warm *warmPool // nil: none

	owners *owners // of sandboxes' user namespaces
	node   string  // nodeMark(StateDir)

	// Test hooks (nil outside tests), set before the runtime's first
	// create: testZygoteAnswer sees the pid of each answer of the
	// zygote, and an error it returns stands for an answer that did not
	// arrive in time; testBeforeJoin runs between a fork and the
	// process's cgroup join, and an error it returns fails the create
	// there.
	testZygoteAnswer func(pid int) error
	testBeforeJoin   func(pid int) error

	ends agentsandbox.Ends // sandbox.EndNotifier

	mu        sync.Mutex // guards following fields
	sandboxes map[string]*Sandbox
	closed    bool
}

// New returns a runtime over opt.StateDir.
func New(ctx context.Context, opt Options) (*Runtime, error) {
	opt = opt.withDefaults()
	if opt.Layers == nil || opt.Network == nil || opt.Cgroups == nil {
		return nil, fmt.Errorf("container runtime: layers, network and cgroups are required")
	}
	dir := filepath.Join(opt.StateDir, "sandboxes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating container state: %w", err)
	}
	if err := mountStateFS(dir); err != nil {
		return nil, err
	}
	own := opt.DataDir
	if own == "" {
		own = opt.StateDir
	}
	for _, p := range append([]string{dir}, opt.Reach...) {
		if err := reachable(p, own); err != nil {
			_ = unmountStateFS(dir)
			return nil, err
		}
	}
	fk, err := newForker(forkers, opt.StateDir)
	if err != nil {
		_ = unmountStateFS(dir)
		return nil, fmt.Errorf("starting the forker: %w", err)
	}
	return &Runtime{opt: opt, log: opt.Logger.With("tier", Tier), forker: fk, sandboxes: map[string]*Sandbox{},
		warm: newWarmPool(opt.Warm, opt.WarmAgents), owners: newOwners(opt.HostUID, opt.IDCount), node: nodeMark(opt.StateDir)}, nil
}

// forkers is how many threads fork sandboxes (a fork takes ~1 ms of CPU).
const forkers = 2

// Tier implements sandbox.Runtime.
func (r *Runtime) Tier() string { return Tier }

// Capabilities implements sandbox.Runtime.
func (r *Runtime) Capabilities() sandbox.Capabilities { return agentsandbox.Capabilities() }

// Fingerprint implements sandbox.Runtime.
func (r *Runtime) Fingerprint(ctx context.Context) api.TierInfo {
	info := api.TierInfo{Name: Tier, Available: true, Accelerator: "none"}
	if os.Geteuid() != 0 {
		info.Available, info.Reason = false, "the container tier needs root (namespaces, mounts, cgroups)"
	}
	return info
}

// Close implements sandbox.Runtime: it forgets its sandboxes, which keep
// running for a later Recover.
func (r *Runtime) Close(ctx context.Context) error {
	// Warm sandboxes are not adopted by the next start: they go now.
	r.closeWarm(ctx)
	r.mu.Lock()
	sbs := r.sandboxes
	r.sandboxes, r.closed = map[string]*Sandbox{}, true
	r.mu.Unlock()
	for _, sb := range sbs {
		sb.detach()
	}
	r.zmu.Lock()
	z := r.zygote
	r.zygote = nil
	r.zmu.Unlock()
	if z != nil {
		z.close()
	}
	r.forker.close()
	return unmountStateFS(filepath.Join(r.opt.StateDir, "sandboxes"))
}

func (r *Runtime) sandboxDir(id string) string {
	return filepath.Join(r.opt.StateDir, "sandboxes", id)
}

// forget drops sb from the runtime's sandboxes (if it is the one under
// its ID: a sandbox that lost a race for its ID is not).
func (r *Runtime) forget(sb *Sandbox) {
	r.mu.Lock()
	if r.sandboxes[sb.id] == sb {
		delete(r.sandboxes, sb.id)
	}
	r.mu.Unlock()
}

func errClosed() error {
	return errdefs.New(errdefs.Unavailable, api.CodeRuntimeClosed, "the container runtime is shutting down")
}
