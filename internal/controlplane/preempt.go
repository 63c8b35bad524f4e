package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// Preemption: a sandbox created with resume_on_preempt whose node is lost
// is not failed but resumed on another node from its trajectory, behind
// the same ID. Its record goes back to pending (requests meanwhile get a
// retryable 503), then to running with one more incarnation; the
// lifecycle stream carries a "resumed" event with the steps replayed.

// resumeAfterLoss tells whether a sandbox lost with its node is resumed
// rather than failed.
func resumeAfterLoss(rec *store.SandboxRecord) bool {
	return rec.ResumeOnPreempt && rec.Trajectory != "" && rec.State == api.StateRunning
}

// preempted resumes rec, lost with node, elsewhere (in the background);
// then done, if set, is told whether it was.
func (m *Manager) preempted(ctx context.Context, rec store.SandboxRecord, why string, done func(ok bool)) {
	m.inflightMu.Lock()
	if _, busy := m.inflight[rec.ID]; busy {
		m.inflightMu.Unlock()
		return
	}
	m.inflight[rec.ID] = struct{}{}
	m.inflightMu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.inflightMu.Lock()
			delete(m.inflight, rec.ID)
			m.inflightMu.Unlock()
		}()
		secret := map[string]string{}
		for _, k := range rec.SecretEnv {
			secret[k] = rec.Env[k]
		}
		m.dropRecording(rec.ID, errPreempted)
		res, err := m.resume(ctx, rec.Owner, rec.Trajectory, api.ResumeRequest{SecretEnv: secret},
			createOpts{id: rec.ID, recreate: true, avoid: rec.Node}, "preempted")
		if done != nil {
			defer func() { done(err == nil) }()
		}
		if err != nil {
			m.log.Warn("resuming a preempted sandbox", "sandbox", rec.ID, "trajectory", rec.Trajectory, "err", err)
			m.fail(ctx, rec.ID, fmt.Sprintf("%s; resuming it failed: %s", why, errdefs.MessageOf(err)))
			return
		}
		m.log.Info("resumed a preempted sandbox", "sandbox", rec.ID, "node", res.Sandbox.Node, "replayed", res.Replayed, "skipped", res.Skipped)
		m.event(store.SandboxRecord{Sandbox: res.Sandbox}, api.StatePending,
			fmt.Sprintf("resumed: %d steps replayed, %d skipped (%s)", res.Replayed, res.Skipped, why))
	}()
}

// recreateRecord moves a preempted sandbox's record to its new node as
// pending, one incarnation on.
func (m *Manager) recreateRecord(ctx context.Context, rec store.SandboxRecord) error {
	_, err := m.mutate(ctx, rec.ID, func(r *store.SandboxRecord) (bool, error) {
		if r.State != api.StatePending && r.State != api.StateRunning {
			return false, notRunning(r)
		}
		keep := r.PhaseHistory
		*r = rec
		r.PhaseHistory = keep
		r.State, r.StateSince, r.Reason, r.EndedAt = api.StatePending, time.Now().UTC(), "resuming", nil
		return true, nil
	})
	return err
}

// notReady is the answer to a request for a sandbox being resumed.
func notReady(rec *store.SandboxRecord) error {
	return &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeTrajectoryInFlight, RetryAfter: time.Second,
		Msg: fmt.Sprintf("sandbox %s is being resumed on another node: retry", rec.ID)}
}
