package controlplane

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
)

// casRetries bounds compare-and-set retries on one record.
const casRetries = 8

// mutate applies fn to the latest record and writes it back with
// compare-and-set, retrying if another writer got there first. fn returns
// false to leave the record unchanged.
func (m *Manager) mutate(ctx context.Context, id string, fn func(rec *store.SandboxRecord) (bool, error)) (store.SandboxRecord, error) {
	for i := 0; i < casRetries; i++ {
		rec, rev, ok := m.cache.get(id)
		if !ok || i > 0 {
			// After a conflict the cache may lag the store; read through.
			var err error
			if rec, rev, err = m.st.GetSandbox(ctx, id); err != nil {
				return rec, err
			}
		}
		prev := rec.State
		change, err := fn(&rec)
		if err != nil || !change {
			return rec, err
		}
		nrev, err := m.st.UpdateSandbox(ctx, rec, rev)
		if errors.Is(err, errdefs.Conflict) {
			continue
		}
		if err != nil {
			m.refresh(id)
			return rec, err
		}
		m.cache.apply(rec, nrev)
		if rec.State != prev {
			m.event(rec, prev, rec.Reason)
			if sandbox.Final(rec.State) {
				m.trajectoryEnded(rec)
			}
		}
		return rec, nil
	}
	return store.SandboxRecord{}, errdefs.New(errdefs.Unavailable, api.CodeContention, "sandbox %s is changing too fast; retry", id)
}

// refresh re-reads a record after a write that failed without saying
// whether it was stored (a timeout): the store's watch skips the writes
// of this manager, so the cache would not learn of it otherwise.
func (m *Manager) refresh(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rec, rev, err := m.st.GetSandbox(ctx, id); err == nil {
		m.cache.apply(rec, rev)
	}
}

// transition moves a sandbox from one state to another, failing with
// Conflict if it is not in from.
func (m *Manager) transition(ctx context.Context, id string, from, to api.State, reason string) (store.SandboxRecord, error) {
	return m.mutate(ctx, id, func(rec *store.SandboxRecord) (bool, error) {
		if rec.State != from {
			return false, errdefs.New(errdefs.Conflict, api.CodeSandboxStateChanged, "sandbox %s is %s, not %s", id, rec.State, from)
		}
		if err := sandbox.CheckTransition(from, to); err != nil {
			return false, err
		}
		setState(rec, to, reason)
		return true, nil
	})
}

func setState(rec *store.SandboxRecord, to api.State, reason string) {
	rec.State = to
	rec.StateSince = time.Now().UTC()
	if reason != "" {
		rec.Reason = reason
	}
	if sandbox.Final(to) {
		t := time.Now().UTC()
		rec.EndedAt = &t
	}
}

// fail marks a pending or running sandbox failed; one being stopped is
// left to its destroy. Errors are logged: fail is called on paths that are
// already reporting another error.
func (m *Manager) fail(ctx context.Context, id, reason string) {
	_, err := m.mutate(ctx, id, func(rec *store.SandboxRecord) (bool, error) {
		if rec.State != api.StatePending && rec.State != api.StateRunning {
			return false, nil
		}
		setState(rec, api.StateFailed, reason)
		return true, nil
	})
	if err != nil {
		m.log.Warn("marking sandbox failed", "sandbox", id, "err", err)
	}
}

// sandboxEnded fails the record of a sandbox its node reports ended by
// itself (its agent died, its VM panicked or powered off): the node has
// released it already. A report about a sandbox this control plane does
// not place on that node, or that is no longer pending or running, is
// answered and changes nothing.
func (m *Manager) sandboxEnded(ctx context.Context, r noderpc.EndedReport) error {
	if rec, _, ok := m.cache.get(r.ID); ok && rec.Node != r.Node {
		return nil
	}
	_, err := m.mutate(ctx, r.ID, func(rec *store.SandboxRecord) (bool, error) {
		if rec.Node != r.Node || rec.State != api.StatePending && rec.State != api.StateRunning {
			return false, nil
		}
		setState(rec, api.StateFailed, r.Reason)
		return true, nil
	})
	if errors.Is(err, errdefs.NotFound) {
		return nil
	}
	if err == nil {
		m.log.Warn("sandbox ended by itself", "sandbox", r.ID, "node", r.Node, "reason", r.Reason)
	}
	return err
}

// event publishes a lifecycle event; failures are logged because the
// record, already written, is the source of truth.
func (m *Manager) event(rec store.SandboxRecord, from api.State, reason string) {
	err := m.st.PublishEvent(context.Background(), store.Event{
		Sandbox: rec.ID, Tier: rec.Tier, Node: rec.Node, From: from, State: rec.State, Reason: reason, Time: time.Now().UTC(),
	})
	if err != nil {
		m.log.Warn("publishing event", "sandbox", rec.ID, "err", err)
	}
}

// Delete destroys a sandbox. Deleting a stopped or failed sandbox
// succeeds and changes nothing.
func (m *Manager) Delete(ctx context.Context, owner, id, reason string) error {
	if _, err := m.owned(owner, id); err != nil {
		return err
	}
	if err := m.destroy(ctx, id, reason); err != nil {
		return err
	}
	// A recorded sandbox's log has its end step once the delete answers:
	// a trainer that deletes and then exports sees the whole episode.
	m.waitEnded(ctx, id)
	return nil
}

// destroy is Delete without the owner check (expiry, shutdown).
func (m *Manager) destroy(ctx context.Context, id, reason string) error {
	ctx = context.WithoutCancel(ctx) // a destroy, once begun, finishes
	rec, err := m.mutate(ctx, id, func(rec *store.SandboxRecord) (bool, error) {
		if !sandbox.Live(rec.State) || rec.State == api.StateStopping {
			return false, nil
		}
		setState(rec, api.StateStopping, reason)
		return true, nil
	})
	if err != nil {
		return err
	}
	if sandbox.Final(rec.State) {
		return nil
	}
	if err := m.nodes.Destroy(ctx, rec.Node, id); err != nil {
		// Left in stopping: the reaper retries.
		m.log.Warn("destroying sandbox on node", "sandbox", id, "node", rec.Node, "err", err)
		return err
	}
	_, err = m.mutate(ctx, id, func(rec *store.SandboxRecord) (bool, error) {
		if rec.State != api.StateStopping {
			return false, nil
		}
		setState(rec, api.StateStopped, "")
		return true, nil
	})
	return err
}

// destroyOnNode removes a sandbox from a node without touching records
// (cleanup of orphans and half-made creates). Errors are logged.
func (m *Manager) destroyOnNode(ctx context.Context, node, id string) {
	if err := m.nodes.Destroy(context.WithoutCancel(ctx), node, id); err != nil {
		m.log.Warn("removing orphan sandbox", "sandbox", id, "node", node, "err", err)
	}
}

// SetTimeout makes a live sandbox expire timeoutS seconds from now.
func (m *Manager) SetTimeout(ctx context.Context, owner, id string, timeoutS int) (api.Sandbox, error) {
	if timeoutS <= 0 || timeoutS > m.lim.MaxTimeoutS {
		return api.Sandbox{}, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "timeout_s must be between 1 and %d", m.lim.MaxTimeoutS)
	}
	if _, err := m.owned(owner, id); err != nil {
		return api.Sandbox{}, err
	}
	rec, err := m.mutate(ctx, id, func(rec *store.SandboxRecord) (bool, error) {
		if rec.State != api.StateRunning && rec.State != api.StatePending {
			return false, notRunning(rec)
		}
		rec.TimeoutS = timeoutS
		rec.ExpiresAt = time.Now().UTC().Add(time.Duration(timeoutS) * time.Second)
		return true, nil
	})
	return rec.Sandbox, err
}

func notRunning(rec *store.SandboxRecord) error {
	return errdefs.New(errdefs.Conflict, api.CodeSandboxNotRunning, "sandbox %s is %s", rec.ID, rec.State)
}

// DestroyAll destroys every live sandbox on node (a `dsec up` shutdown
// without --keep-sandboxes), a few at a time, and waits for them.
func (m *Manager) DestroyAll(ctx context.Context, node, reason string) {
	var ids []string
	m.cache.each(func(rec *store.SandboxRecord) {
		if rec.Node == node && sandbox.Live(rec.State) {
			ids = append(ids, rec.ID)
		}
	})
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := m.destroy(ctx, id, reason); err != nil {
				m.log.Warn("destroying sandbox", "sandbox", id, "err", err)
			}
		}()
	}
	wg.Wait()
}
