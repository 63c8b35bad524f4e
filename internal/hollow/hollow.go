// Package hollow provides the simulated tiers of hollow nodes (`dsec node
// --hollow N`): runtimes whose sandboxes exist only as the node's records.
// A hollow node speaks the real node protocol (it heartbeats, takes
// creates, execs and deletes, and the control plane places on it like on
// any node) but makes no OS object: no process, mount, cgroup or file. It
// is how the control plane is measured at fleet scale on one machine, and
// how operators plan capacity.
//
// A hollow sandbox's exec succeeds at once with exit code 0 and no
// output (streams get nothing); its stats are zero; its files API, and
// every optional feature (processes, phases, snapshots), is refused with
// unsupported_on_tier. A hollow sandbox takes a few dozen bytes.
package hollow

import (
	"context"
	"io"
	"sync/atomic"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Tiers are the tiers a hollow node offers: all of them.
var Tiers = []string{api.TierFunction, api.TierContainer, api.TierMicroVM, api.TierVM}

// Registry returns a registry of hollow runtimes for every tier.
func Registry() *sandbox.Registry {
	reg := sandbox.NewRegistry()
	for _, t := range Tiers {
		_ = reg.Register(Runtime{tier: t}) // each tier once: cannot fail
	}
	return reg
}

// Runtime is one hollow tier. It keeps nothing: the node holds its
// sandboxes.
type Runtime struct{ tier string }

var _ sandbox.Runtime = Runtime{}

func (r Runtime) Tier() string { return r.tier }

// Capabilities: commands are strings for a shell (none runs), and the
// tier takes its image's layers itself (it needs no layer cache).
func (r Runtime) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Shell: true, FileRoot: "/", OwnRoot: true}
}

func (r Runtime) Fingerprint(ctx context.Context) api.TierInfo {
	return api.TierInfo{Name: r.tier, Available: true, Accelerator: "none"}
}

func (r Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &Sandbox{id: spec.ID, tier: r.tier}, nil
}

// Recover finds nothing: a hollow node's sandboxes end with its process.
func (r Runtime) Recover(ctx context.Context) ([]sandbox.Sandbox, error) { return nil, nil }

func (r Runtime) Close(ctx context.Context) error { return nil }

// Sandbox is a hollow sandbox.
type Sandbox struct {
	id   string
	tier string
	gone atomic.Bool
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

func (s *Sandbox) ID() string { return s.id }

// Exec succeeds at once: exit code 0, no output.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	if err := s.live(); err != nil {
		return api.ExecResult{}, err
	}
	if req.Stdin != nil {
		_, _ = io.Copy(io.Discard, req.Stdin) // taken, as a command that ignores it
	}
	return api.ExecResult{}, nil
}

func (s *Sandbox) Files() sandbox.Files { return files{s} }

func (s *Sandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	return sandbox.Stats{}, s.live()
}

func (s *Sandbox) Destroy(ctx context.Context) error {
	s.gone.Store(true)
	return nil
}

func (s *Sandbox) live() error {
	if s.gone.Load() {
		return errdefs.New(errdefs.NotFound, api.CodeSandboxNotFound, "sandbox %s is destroyed", s.id)
	}
	return nil
}

// files refuses the files API: a hollow sandbox has no file system.
type files struct{ s *Sandbox }

func (f files) refuse() error {
	if err := f.s.live(); err != nil {
		return err
	}
	return errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier, "sandbox %s is hollow (a simulated %s sandbox): it has no files", f.s.id, f.s.tier)
}

func (f files) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	return nil, api.FileInfo{}, f.refuse()
}

func (f files) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	return api.FileInfo{}, f.refuse()
}

func (f files) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	return nil, f.refuse()
}

func (f files) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	return api.FileInfo{}, f.refuse()
}

func (f files) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	return api.FileInfo{}, f.refuse()
}

func (f files) Remove(ctx context.Context, p string, recursive bool) error { return f.refuse() }

func (f files) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	return api.FileInfo{}, f.refuse()
}
