package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/trajectory"
)

// stepPage is how many steps a resume reads from the log at a time.
const stepPage = 500

// Resume rebuilds a trajectory's sandbox from its log: a new sandbox from
// the logged spec (on its latest snapshot unless told otherwise), then
// every step after that snapshot that changed state, replayed in order
// without pauses, each result checked against the log. Pure steps are
// skipped. The new sandbox then records to the same trajectory, and
// answers requests that match the log from it until one differs (a
// harness that starts its loop again).
func (m *Manager) Resume(ctx context.Context, owner, trajID string, req api.ResumeRequest) (api.ResumeResult, error) {
	return m.resume(ctx, owner, trajID, req, createOpts{}, "request")
}

func (m *Manager) resume(ctx context.Context, owner, trajID string, req api.ResumeRequest, o createOpts, reason string) (api.ResumeResult, error) {
	if m.traj == nil {
		return api.ResumeResult{}, noTrajectories()
	}
	switch req.OnDivergence {
	case "":
		req.OnDivergence = api.DivergenceStop
	case api.DivergenceStop, api.DivergenceContinue:
	default:
		return api.ResumeResult{}, errdefs.New(errdefs.Invalid, api.CodeInvalidOnDivergence, "on_divergence is %q or %q", api.DivergenceStop, api.DivergenceContinue)
	}
	start := time.Now()
	h, err := m.claimTrajectory(ctx, owner, trajID, o.id)
	if err != nil {
		return api.ResumeResult{}, err
	}
	steps, err := m.allSteps(ctx, trajID)
	if err != nil {
		m.releaseTrajectory(trajID, h)
		return api.ResumeResult{}, err
	}
	creq, base, err := m.resumeSpec(ctx, owner, steps, req)
	if err != nil {
		m.releaseTrajectory(trajID, h)
		return api.ResumeResult{}, err
	}
	o.resumed, o.incarnation = true, h.Incarnations+1
	rec, err := m.create(ctx, owner, creq, o)
	if err != nil {
		m.releaseTrajectory(trajID, h)
		return api.ResumeResult{}, err
	}
	// The record stays pending through the replay; reconciliation must
	// not take it for an interrupted create.
	m.trackCreate(rec.ID, true)
	defer m.trackCreate(rec.ID, false)
	rp := replay{m: m, rec: rec, traj: trajID, secret: req.SecretEnv, stop: req.OnDivergence == api.DivergenceStop}
	for _, st := range steps {
		if st.Step <= base {
			continue
		}
		if rp.done() {
			break
		}
		if err := rp.step(ctx, st); err != nil {
			// The sandbox could not take a logged step at all (not a
			// different result): it is no use, and goes.
			_ = m.destroy(ctx, rec.ID, "resume_failed")
			m.releaseTrajectory(trajID, h)
			return api.ResumeResult{}, errdefs.Within(errdefs.ClassOf(err), errdefs.CodeOf(err), err, "replaying step %d of %s", st.Step, trajID)
		}
	}
	res := api.ResumeResult{Replayed: rp.replayed, Skipped: rp.skipped, Divergence: rp.div}
	if snap := snapshotAt(steps, base); snap != "" {
		res.From = snap
	}
	r, err := m.recording(ctx, rec)
	if err != nil {
		return res, err
	}
	r.mu.Lock()
	mark := api.TrajectoryStep{Kind: api.KindResume, Resume: &api.StepResume{From: res.From, Replayed: rp.replayed, Skipped: rp.skipped, Reason: reason, Divergence: rp.div}}
	err = m.appendStep(ctx, r, rec, &mark)
	if err == nil && rp.div == nil && reason == "request" {
		// Only a caller that asked for the resume may be starting its
		// loop again; a preempted sandbox's client carries on.
		r.ff = &fastForward{steps: steps}
	}
	r.mu.Unlock()
	if err != nil {
		_ = m.destroy(ctx, rec.ID, "resume_failed")
		m.releaseTrajectory(trajID, h)
		return res, err
	}
	if rec, err = m.settleResume(ctx, trajID, rec, rp.div); err != nil {
		_ = m.destroy(ctx, rec.ID, "resume_failed")
		return res, err
	}
	res.Sandbox = rec.Sandbox
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	return res, nil
}

// claimTrajectory marks owner's trajectory as resuming, so that two
// resumes of one trajectory cannot both run. A trajectory whose sandbox
// still runs is refused, unless that sandbox is the one being resumed
// behind its ID (preemption: keep).
func (m *Manager) claimTrajectory(ctx context.Context, owner, id, keep string) (trajectory.Head, error) {
	var prev trajectory.Head
	_, err := m.traj.MutateHead(ctx, id, func(h *trajectory.Head) error {
		if h.Owner != owner {
			return errdefs.New(errdefs.NotFound, api.CodeTrajectoryNotFound, "trajectory %q not found", id)
		}
		if h.State == api.TrajectoryResuming {
			return errdefs.New(errdefs.Conflict, api.CodeTrajectoryRunning, "trajectory %s is being resumed", id)
		}
		if h.Sandbox != "" && h.Sandbox != keep {
			if rec, _, ok := m.cache.get(h.Sandbox); ok && sandbox.Live(rec.State) && rec.Trajectory == id {
				return errdefs.New(errdefs.Conflict, api.CodeTrajectoryRunning, "sandbox %s records trajectory %s: delete it before resuming", h.Sandbox, id)
			}
		}
		prev = *h
		h.State, h.UpdatedAt = api.TrajectoryResuming, time.Now().UTC()
		return nil
	})
	return prev, err
}

// releaseTrajectory puts back the head a failed resume claimed.
func (m *Manager) releaseTrajectory(id string, prev trajectory.Head) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := m.traj.MutateHead(ctx, id, func(h *trajectory.Head) error {
		if h.State != api.TrajectoryResuming {
			return errNoChange
		}
		h.State, h.UpdatedAt = prev.State, time.Now().UTC()
		return nil
	})
	if err != nil && !errors.Is(err, errNoChange) {
		m.log.Warn("releasing a trajectory after a failed resume", "trajectory", id, "err", err)
	}
}

// settleResume records the new incarnation in the head and, after a
// divergence, on the sandbox.
func (m *Manager) settleResume(ctx context.Context, id string, rec store.SandboxRecord, div *api.Divergence) (store.SandboxRecord, error) {
	_, err := m.traj.MutateHead(ctx, id, func(h *trajectory.Head) error {
		h.State, h.Sandbox, h.Tier, h.Incarnations, h.Divergence = api.TrajectoryRecording, rec.ID, rec.Tier, rec.Incarnation, div
		if div != nil {
			h.State = api.TrajectoryDiverged
		}
		h.UpdatedAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return rec, err
	}
	return m.mutate(ctx, rec.ID, func(r *store.SandboxRecord) (bool, error) {
		if r.State != api.StatePending {
			return false, notRunning(r) // deleted during the replay
		}
		setState(r, api.StateRunning, "")
		r.Reason, r.Divergence = "", div
		return true, nil
	})
}

// allSteps reads a trajectory's whole log.
func (m *Manager) allSteps(ctx context.Context, id string) ([]api.TrajectoryStep, error) {
	var all []api.TrajectoryStep
	for after := 0; ; {
		page, err := m.traj.Steps(ctx, id, after, stepPage)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < stepPage {
			return all, nil
		}
		after = page[len(page)-1].Step
	}
}

// resumeSpec is the create a resume makes, and the step its state
// already holds: the latest snapshot's (that still exists), else the
// create's.
func (m *Manager) resumeSpec(ctx context.Context, owner string, steps []api.TrajectoryStep, req api.ResumeRequest) (api.CreateSandboxRequest, int, error) {
	if len(steps) == 0 || steps[0].Kind != api.KindCreate {
		return api.CreateSandboxRequest{}, 0, errdefs.New(errdefs.NotFound, api.CodeTrajectoryNotFound, "the trajectory's log does not begin with its create (its steps expired or were deleted)")
	}
	c := steps[0].Create
	creq := c.Request
	creq.Env = maps.Clone(creq.Env)
	for _, k := range c.SecretEnv {
		v, ok := req.SecretEnv[k]
		if !ok {
			return creq, 0, errdefs.New(errdefs.Invalid, api.CodeSecretEnvMissing, "the trajectory's env has secret %q: give its value in secret_env", k)
		}
		if creq.Env == nil {
			creq.Env = map[string]string{}
		}
		creq.Env[k] = v
	}
	creq.SecretEnv, creq.Record = c.SecretEnv, false
	if req.Tier != "" {
		creq.Tier = req.Tier
	}
	if req.TimeoutS > 0 {
		creq.TimeoutS = req.TimeoutS
	}
	base := steps[0].Step
	if c.FromSnapshot != "" {
		creq.FromSnapshot, creq.Image = c.FromSnapshot, ""
	}
	if !req.FromScratch {
		for i := len(steps) - 1; i > 0; i-- {
			s := steps[i].Snapshot
			if steps[i].Kind != api.KindSnapshot || s == nil {
				continue
			}
			if _, err := m.snapshot(ctx, owner, s.ID); err != nil {
				continue // deleted: an earlier one, or the create
			}
			creq.FromSnapshot, creq.Image, base = s.ID, "", steps[i].Step
			break
		}
	}
	return creq, base, nil
}

// snapshotAt is the snapshot logged at step n, if any.
func snapshotAt(steps []api.TrajectoryStep, n int) string {
	for _, st := range steps {
		if st.Step == n && st.Snapshot != nil {
			return st.Snapshot.ID
		}
	}
	return ""
}

// replay runs logged steps in a resumed sandbox.
type replay struct {
	m      *Manager
	rec    store.SandboxRecord
	traj   string
	secret map[string]string
	stop   bool

	replayed, skipped int
	div               *api.Divergence
}

func (r *replay) done() bool { return r.stop && r.div != nil }

// step replays one logged step. A result that differs from the log is a
// divergence (recorded; the caller stops or goes on); an error is a step
// the sandbox could not take.
func (r *replay) step(ctx context.Context, st api.TrajectoryStep) error {
	m, rec := r.m, r.rec
	if st.Pure {
		r.skipped++
		return nil
	}
	var err error
	switch st.Kind {
	case api.KindExec:
		err = r.exec(ctx, st)
	case api.KindWrite:
		err = r.write(ctx, st)
	case api.KindMkdir:
		_, err = m.nodes.Mkdir(ctx, rec.Node, rec.ID, st.File.Path, st.File.Parents)
	case api.KindRemove:
		err = m.nodes.Remove(ctx, rec.Node, rec.ID, st.File.Path, st.File.Recursive)
	case api.KindRename:
		_, err = m.nodes.Rename(ctx, rec.Node, rec.ID, st.File.Path, st.File.To)
	case api.KindPhase:
		err = r.phase(ctx, st)
	default: // create, snapshot, resume, end: nothing to do
		return nil
	}
	if err == nil {
		r.replayed++
	}
	return err
}

func (r *replay) exec(ctx context.Context, st api.TrajectoryStep) error {
	m, rec, se := r.m, r.rec, st.Exec
	req := se.Request
	req.Env = maps.Clone(req.Env)
	for _, k := range rec.SecretEnv {
		if _, ok := req.Env[k]; ok {
			req.Env[k] = r.secret[k]
		}
	}
	if se.StdinDigest != "" {
		stdin, err := m.stepOutput(ctx, r.traj, "", se.StdinDigest)
		if err != nil {
			return err
		}
		req.Stdin = stdin
	}
	if se.Process {
		_, err := m.nodes.StartProcess(ctx, rec.Node, rec.ID, req)
		return err
	}
	res, err := m.nodes.Exec(ctx, rec.Node, rec.ID, req, nil)
	if err != nil {
		return err
	}
	got := trajectory.OutputDigest(res.Stdout, res.Stderr)
	if res.ExitCode != se.ExitCode || got != se.OutputDigest {
		r.diverged(st, fmt.Sprintf("exit %d, output %s", se.ExitCode, se.OutputDigest), fmt.Sprintf("exit %d, output %s", res.ExitCode, got))
	}
	return nil
}

func (r *replay) write(ctx context.Context, st api.TrajectoryStep) error {
	m, rec, f := r.m, r.rec, st.File
	rc, _, err := m.traj.Blob(ctx, r.traj, f.Digest)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = m.nodes.WriteFile(ctx, rec.Node, rec.ID, f.Path, rc, noderpc.FileRequest{Mode: f.Mode, Parents: f.Parents, MaxBytes: m.lim.MaxFileBytes})
	return err
}

func (r *replay) phase(ctx context.Context, st api.TrajectoryStep) error {
	m, rec := r.m, r.rec
	for _, p := range rec.Phases {
		if p.Name != st.Phase.Phase {
			continue
		}
		if err := m.nodes.SetPhase(ctx, rec.Node, rec.ID, p); err != nil {
			return err
		}
		var err error
		r.rec, err = m.mutate(ctx, rec.ID, func(sr *store.SandboxRecord) (bool, error) {
			sr.Phase = p.Name
			sr.PhaseHistory = append(sr.PhaseHistory, api.PhaseChange{Phase: p.Name, At: time.Now().UTC()})
			return true, nil
		})
		return err
	}
	return errdefs.New(errdefs.Invalid, api.CodeUnknownPhase, "the log moves to phase %q, which the sandbox does not have", st.Phase.Phase)
}

func (r *replay) diverged(st api.TrajectoryStep, logged, replayed string) {
	if r.div == nil {
		r.div = &api.Divergence{Step: st.Step, Kind: st.Kind, Logged: logged, Replayed: replayed}
	}
}
