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
//
// The snapshot's layer uploads to the blob store while the children
// start from the parent node's layer cache (a child placed on another
// node waits for the upload); the fork answers once both are done, so
// an answered fork's snapshot is stored. The parent's trajectory waits
// meanwhile: the snapshot is its next step.
func (m *Manager) Fork(ctx context.Context, owner, id string, req api.ForkRequest) (api.ForkResult, error) {
	if req.Count < 1 || req.Count > m.lim.MaxForkCount {
		return api.ForkResult{}, errdefs.New(errdefs.Invalid, api.CodeInvalidForkCount, "count must be between 1 and %d", m.lim.MaxForkCount)
	}
	if req.TimeoutS < 0 || req.TimeoutS > m.lim.MaxTimeoutS {
		return api.ForkResult{}, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "timeout_s must be between 0 and %d", m.lim.MaxTimeoutS)
	}
	rec, r, unlock, err := m.holdForSnapshot(ctx, owner, id)
	if err != nil {
		return api.ForkResult{}, err
	}
	defer unlock()
	p, err := m.beginSnapshot(ctx, rec, r, true)
	if err != nil {
		return api.ForkResult{}, err
	}
	snap := p.snap
	stored := make(chan struct{})
	var storeErr error
	go func() {
		defer close(stored)
		storeErr = m.awaitStored(ctx, p)
	}()
	await := func(ctx context.Context) error {
		select {
		case <-stored:
			return storeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	children, err := m.forkChildren(ctx, owner, id, snap, req, await)
	<-stored // bounded: the upload's wait ends with ctx or the node's snapshot timeout
	if err == nil && storeErr != nil {
		err = storeErr
	}
	if err == nil {
		snap, err = m.endSnapshot(ctx, p, r)
	} else {
		m.dropSnapshot(ctx, p)
	}
	if err != nil {
		for _, c := range children {
			_ = m.destroy(ctx, c.ID, "fork_failed")
		}
		return api.ForkResult{}, err
	}
	res := api.ForkResult{Snapshot: snap}
	for _, c := range children {
		res.Sandboxes = append(res.Sandboxes, c.Sandbox)
	}
	return res, nil
}

// forkChildren makes a fork's children from snap; if one cannot be made
// it destroys the others and returns its error.
func (m *Manager) forkChildren(ctx context.Context, owner, id string, snap api.Snapshot, req api.ForkRequest, await func(context.Context) error) ([]store.SandboxRecord, error) {
	parent, err := m.owned(owner, id)
	if err != nil {
		return nil, err
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
			children[i], errs[i] = m.forkChild(ctx, owner, parent, snap, req, i, await)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for j, c := range children {
				if errs[j] == nil {
					_ = m.destroy(ctx, c.ID, "fork_failed")
				}
			}
			return nil, errdefs.Within(errdefs.ClassOf(err), errdefs.CodeOf(err), err, "fork child %d", i)
		}
	}
	return children, nil
}

// forkChild makes child n of a fork.
func (m *Manager) forkChild(ctx context.Context, owner string, parent store.SandboxRecord, snap api.Snapshot, req api.ForkRequest, n int, await func(context.Context) error) (store.SandboxRecord, error) {
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
	o := createOpts{node: parent.Node, await: await}
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
