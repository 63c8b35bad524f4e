package controlplane

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// forkParallel bounds the creates of one fork that run at once.
const forkParallel = 8

// Fork starts count new sandboxes from a running sandbox's current state
// (through a snapshot); the parent runs on. Each child gets the parent's
// spec, starts in the parent's phase, and, if the parent records a
// trajectory, records its own child trajectory ("<parent>/fork-<step>-<n>")
// that names the parent and the step it forked at. Children prefer the
// parent's node, where the snapshot's pages are shared. If one child
// cannot be made, none is kept.
func (m *Manager) Fork(ctx context.Context, owner, id string, req api.ForkRequest) (api.ForkResult, error) {
	if req.Count < 1 || req.Count > m.lim.MaxForkCount {
		return api.ForkResult{}, errdefs.New(errdefs.Invalid, api.CodeInvalidForkCount, "count must be between 1 and %d", m.lim.MaxForkCount)
	}
	if req.TimeoutS < 0 || req.TimeoutS > m.lim.MaxTimeoutS {
		return api.ForkResult{}, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "timeout_s must be between 0 and %d", m.lim.MaxTimeoutS)
	}
	snap, err := m.Snapshot(ctx, owner, id)
	if err != nil {
		return api.ForkResult{}, err
	}
	parent, err := m.owned(owner, id)
	if err != nil {
		return api.ForkResult{}, err
	}
	children := make([]store.SandboxRecord, req.Count)
	errs := make([]error, req.Count)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			children[i], errs[i] = m.forkChild(ctx, owner, parent, snap, req, i)
		}()
	}
	wg.Wait()
	res := api.ForkResult{Snapshot: snap}
	for i, err := range errs {
		if err != nil {
			for j, c := range children {
				if errs[j] == nil {
					_ = m.destroy(ctx, c.ID, "fork_failed")
				}
			}
			return api.ForkResult{}, errdefs.Within(errdefs.ClassOf(err), errdefs.CodeOf(err), err, "fork child %d", i)
		}
		res.Sandboxes = append(res.Sandboxes, children[i].Sandbox)
	}
	return res, nil
}

// forkChild makes child n of a fork.
func (m *Manager) forkChild(ctx context.Context, owner string, parent store.SandboxRecord, snap api.Snapshot, req api.ForkRequest, n int) (store.SandboxRecord, error) {
	creq := api.CreateSandboxRequest{
		Tier: parent.Tier, FromSnapshot: snap.ID, CPU: parent.CPU, MemoryMB: parent.MemoryMB, DiskMB: parent.DiskMB,
		TimeoutS: parent.TimeoutS, Env: maps.Clone(parent.Env), SecretEnv: parent.SecretEnv, Labels: maps.Clone(parent.Labels),
		Network: parent.Network, Phases: parent.Phases, Capabilities: parent.Capabilities,
	}
	if req.TimeoutS > 0 {
		creq.TimeoutS = req.TimeoutS
	}
	if req.Labels != nil {
		creq.Labels = maps.Clone(req.Labels)
	}
	o := createOpts{node: parent.Node}
	if parent.Trajectory != "" {
		creq.Trajectory = fmt.Sprintf("%s/fork-%d-%d", parent.Trajectory, snap.Step, n+1)
		o.parent, o.parentStep = parent.Trajectory, snap.Step
	}
	child, err := m.create(ctx, owner, creq, o)
	if err != nil {
		return child, err
	}
	if parent.Phase != "" && parent.Phase != child.Phase {
		sb, err := m.SetPhase(ctx, owner, child.ID, api.SetPhaseRequest{Phase: parent.Phase, Back: true})
		if err != nil {
			_ = m.destroy(ctx, child.ID, "fork_failed")
			return child, err
		}
		child.Sandbox = sb
	}
	return child, nil
}
