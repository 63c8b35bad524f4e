package container

import (
	"context"
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/network"
)

// The runtime's dependencies, as the runtime uses them. The daemon passes
// the node's layer cache, *network.Manager and *cgroups.Manager.

// layerRoots is the node's layer cache.
type layerRoots interface {
	// DetachedRoot builds sandbox id's writable overlay over layers, as
	// a detached mount.
	DetachedRoot(ctx context.Context, id string, layers []layerspec.Layer, upper string) (*os.File, func(), error)
	// Hold keeps layers in the cache (an adopted sandbox's).
	Hold(ctx context.Context, layers []layerspec.Layer) (func(), error)
	// View shows layers read-only (one layer: its own mount).
	View(ctx context.Context, layers []layerspec.Layer) (string, func(), error)
}

// networks gives sandboxes their network namespaces, with egress policy
// enforced on the host.
type networks interface {
	Acquire(ctx context.Context, id string, p network.Policy) (*network.Endpoint, error)
	SetPolicy(ctx context.Context, id string, p network.Policy) error
	Endpoint(id string) (*network.Endpoint, bool)
	Release(ctx context.Context, id string) error
	// Recover removes the networks of sandboxes not in live.
	Recover(ctx context.Context, live []string) error
}

// watcher is the node's eBPF monitor (audit.Recorder): it attributes the
// tasks of a cgroup2 group to a sandbox.
type watcher interface {
	Watch(id string, cgroupID uint64, phase func(at time.Time) string) error
	Unwatch(cgroupID uint64)
	// Record records an event the node saw itself (a process a phase
	// change killed).
	Record(id, phase string, e monitor.Event)
}

// execGuard is the node's eBPF monitor as the enforcer of allowed
// executables (monitor.Monitor): it kills, in the kernel, every exec by
// a task of a restricted cgroup2 group of a file not on the group's
// root file system (rootDev, the kernel's encoding) or not at one of
// paths (files, or "dir/*" for every file directly in dir).
type execGuard interface {
	RestrictExec(cgroupID, rootDev uint64, paths []string) error
	UnrestrictExec(cgroupID uint64) error
}

// cgroupManager makes and finds sandboxes' control groups.
type cgroupManager interface {
	Create(ctx context.Context, id string, l cgroups.Limits) (*cgroups.Group, error)
	Open(id string) (*cgroups.Group, error)
	// Recycle kills the group's tasks and keeps it for another Create
	// (or removes it).
	Recycle(ctx context.Context, g *cgroups.Group) error
	// Rename gives a group another name (a claimed warm sandbox's).
	Rename(ctx context.Context, g *cgroups.Group, id string) (*cgroups.Group, error)
	// Sweep kills and removes the groups not in live.
	Sweep(ctx context.Context, live []string) error
}
