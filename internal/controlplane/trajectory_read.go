package controlplane

import (
	"context"
	"encoding/json"
	"io"
	"strconv"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/trajectory"
)

// maxStepPage bounds one page of GET /v1/trajectories/{id}/steps.
const maxStepPage = 1000

// ownedTrajectory returns owner's trajectory; another owner's is not
// found, exactly as one that does not exist.
func (m *Manager) ownedTrajectory(ctx context.Context, owner, id string) (trajectory.Head, error) {
	if m.traj == nil {
		return trajectory.Head{}, noTrajectories()
	}
	if err := trajectory.ValidID(id); err != nil {
		return trajectory.Head{}, err
	}
	h, _, err := m.traj.Head(ctx, id)
	if err != nil {
		return h, err
	}
	if h.Owner != owner {
		return trajectory.Head{}, errdefs.New(errdefs.NotFound, api.CodeTrajectoryNotFound, "trajectory %q not found", id)
	}
	return h, nil
}

// GetTrajectory returns owner's trajectory's head.
func (m *Manager) GetTrajectory(ctx context.Context, owner, id string) (api.Trajectory, error) {
	h, err := m.ownedTrajectory(ctx, owner, id)
	return h.Trajectory, err
}

// ListTrajectories lists owner's trajectories, a page at a time.
func (m *Manager) ListTrajectories(ctx context.Context, owner, pageToken string, limit int) (api.TrajectoryList, error) {
	if m.traj == nil {
		return api.TrajectoryList{}, noTrajectories()
	}
	if limit <= 0 || limit > maxStepPage {
		limit = 100
	}
	hs, next, err := m.traj.List(ctx, owner, pageToken, limit)
	if err != nil {
		return api.TrajectoryList{}, err
	}
	out := api.TrajectoryList{Trajectories: []api.Trajectory{}, NextPageToken: next}
	for _, h := range hs {
		out.Trajectories = append(out.Trajectories, h.Trajectory)
	}
	return out, nil
}

// TrajectorySteps returns up to limit steps of owner's trajectory after
// step after, with the audit events of each step's sandbox that the
// monitor tagged with that step.
func (m *Manager) TrajectorySteps(ctx context.Context, owner, id string, after, limit int) (api.TrajectorySteps, error) {
	h, err := m.ownedTrajectory(ctx, owner, id)
	if err != nil {
		return api.TrajectorySteps{}, err
	}
	if after < 0 || limit < 0 || limit > maxStepPage {
		return api.TrajectorySteps{}, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "after must be ≥ 0 and limit between 0 and %d", maxStepPage)
	}
	if limit == 0 {
		limit = 100
	}
	steps, err := m.traj.Steps(ctx, id, after, limit)
	if err != nil {
		return api.TrajectorySteps{}, err
	}
	if err := m.joinAudit(ctx, steps); err != nil {
		return api.TrajectorySteps{}, err
	}
	out := api.TrajectorySteps{Trajectory: h.Trajectory, Steps: steps}
	if steps == nil {
		out.Steps = []api.TrajectoryStep{}
	}
	if len(steps) == limit {
		out.NextPageToken = strconv.Itoa(steps[len(steps)-1].Step)
	}
	return out, nil
}

// joinAudit gives each step the audit events its sandbox's monitor
// tagged with the step's number. The events live in the audit stream,
// kept as long as trajectories, and are joined when read: they can
// arrive after the step was logged.
func (m *Manager) joinAudit(ctx context.Context, steps []api.TrajectoryStep) error {
	bySandbox := map[string][]api.AuditEvent{}
	for i := range steps {
		st := &steps[i]
		evs, ok := bySandbox[st.Sandbox]
		if !ok {
			var err error
			if evs, err = m.st.AuditEvents(ctx, st.Sandbox, 0, maxAuditEvents); err != nil {
				return err
			}
			bySandbox[st.Sandbox] = evs
		}
		for _, e := range evs {
			if e.Step == st.Step {
				st.Audit = append(st.Audit, e)
			}
		}
	}
	return nil
}

// ExportTrajectory writes owner's trajectory as JSON lines, one step per
// line, in order, audit events included.
func (m *Manager) ExportTrajectory(ctx context.Context, owner, id string, w io.Writer) error {
	if _, err := m.ownedTrajectory(ctx, owner, id); err != nil {
		return err
	}
	enc := json.NewEncoder(w) // one line per value
	for after := 0; ; {
		page, err := m.traj.Steps(ctx, id, after, stepPage)
		if err != nil {
			return err
		}
		if err := m.joinAudit(ctx, page); err != nil {
			return err
		}
		for i := range page {
			if err := enc.Encode(&page[i]); err != nil {
				return err
			}
		}
		if len(page) < stepPage {
			return nil
		}
		after = page[len(page)-1].Step
	}
}

// TrajectoryBlob opens a blob of owner's trajectory (a long output, a
// written file's content).
func (m *Manager) TrajectoryBlob(ctx context.Context, owner, id, digest string) (io.ReadCloser, int64, error) {
	if _, err := m.ownedTrajectory(ctx, owner, id); err != nil {
		return nil, 0, err
	}
	return m.traj.Blob(ctx, id, digest)
}

// DeleteTrajectory removes owner's trajectory: its log, blobs and head.
// A trajectory a live sandbox records to is refused; its snapshots are
// kept (they are records of their own, deleted by themselves).
func (m *Manager) DeleteTrajectory(ctx context.Context, owner, id string) error {
	h, err := m.ownedTrajectory(ctx, owner, id)
	if err != nil {
		return err
	}
	if h.State == api.TrajectoryResuming {
		return errdefs.New(errdefs.Conflict, api.CodeTrajectoryRunning, "trajectory %s is being resumed", id)
	}
	if rec, _, ok := m.cache.get(h.Sandbox); ok && rec.Trajectory == id && !sandbox.Final(rec.State) {
		return errdefs.New(errdefs.Conflict, api.CodeTrajectoryRunning, "sandbox %s records trajectory %s: delete it first", h.Sandbox, id)
	}
	if err := m.traj.Delete(ctx, id); err != nil {
		return err
	}
	// Its snapshots go with it (their layers at the next sweep).
	return m.deleteTrajectorySnapshots(ctx, id)
}
