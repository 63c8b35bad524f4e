package controlplane

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/trajectory"
)

// validateTrajectory checks a create's trajectory fields: a valid name
// (or one made up for record), secret env keys the env has, and a
// snapshot to start from that the owner may use (it becomes the image).
func (m *Manager) validateTrajectory(ctx context.Context, owner string, req *api.CreateSandboxRequest) error {
	if req.Record && req.Trajectory == "" {
		req.Trajectory = trajectory.NewID()
	}
	if req.Trajectory != "" || req.ResumeOnPreempt {
		if m.traj == nil {
			return noTrajectories()
		}
		if req.Trajectory == "" {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidTrajectoryID, "resume_on_preempt needs a trajectory (trajectory or record)")
		}
		if err := trajectory.ValidID(req.Trajectory); err != nil {
			return err
		}
	}
	for _, k := range req.SecretEnv {
		if _, ok := req.Env[k]; !ok {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidEnv, "secret_env names %q, which env does not set", k)
		}
	}
	if req.FromSnapshot != "" {
		if req.Layers != nil || req.Image != "" && req.Image != m.lim.DefaultImages[req.Tier] {
			return errdefs.New(errdefs.Invalid, api.CodeImageAndLayers, "from_snapshot gives the image: leave image and layers out")
		}
		snap, err := m.snapshot(ctx, owner, req.FromSnapshot)
		if err != nil {
			return err
		}
		if snap.Tier != req.Tier && !snapshotPortable(snap.Tier, req.Tier) {
			return errdefs.New(errdefs.Invalid, api.CodeImageTierMismatch, "snapshot %s is of a %s sandbox, not %s", snap.ID, snap.Tier, req.Tier)
		}
		req.Image = snap.Image
	}
	return nil
}

// snapshotPortable reports whether a state layer taken on one tier can
// start a sandbox of another: container and function state layers are
// both file trees over the same image. A microvm or vm state layer is a
// file tree too, but of a guest whose image, ids and kernel are its
// tier's: it starts sandboxes of that tier only.
func snapshotPortable(from, to string) bool {
	fs := []string{api.TierContainer, api.TierFunction}
	return slices.Contains(fs, from) && slices.Contains(fs, to)
}

// beginTrajectory makes a new trajectory's head. A name in use is a
// conflict, whoever owns it.
func (m *Manager) beginTrajectory(ctx context.Context, owner string, rec store.SandboxRecord, o createOpts) error {
	now := time.Now().UTC()
	h := trajectory.Head{Owner: owner}
	h.ID, h.State, h.Sandbox, h.Tier = rec.Trajectory, api.TrajectoryRecording, rec.ID, rec.Tier
	h.Parent, h.ParentStep = o.parent, o.parentStep
	h.Incarnations, h.ResumeOnPreempt = 1, rec.ResumeOnPreempt
	h.CreatedAt, h.UpdatedAt = now, now
	if err := m.traj.Begin(ctx, h); err != nil {
		return err
	}
	// A new log: its first step is 1, no need to read the log for it.
	m.recs.mu.Lock()
	m.recs.m[rec.ID] = &recording{traj: rec.Trajectory, next: 1}
	m.recs.mu.Unlock()
	return nil
}

// abandonTrajectory removes the head of a trajectory whose sandbox was
// never made: nothing was logged, and the name may be used again.
func (m *Manager) abandonTrajectory(rec store.SandboxRecord) {
	m.dropRecording(rec.ID, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.traj.Delete(ctx, rec.Trajectory); err != nil {
		m.log.Warn("removing the trajectory of a failed create", "trajectory", rec.Trajectory, "err", err)
	}
}

// startLog is a new trajectory's head and create step being written
// while its sandbox is made.
type startLog struct {
	done  chan struct{}
	began bool  // the head was made (set before done closes)
	err   error // set before done closes
}

// startLogging begins rec's trajectory and logs its create step in the
// background. Nothing else can step the sandbox meanwhile: it is pending
// until the create waits for this.
func (m *Manager) startLogging(ctx context.Context, owner string, rec store.SandboxRecord, req api.CreateSandboxRequest, img image.Resolved, o createOpts) *startLog {
	l := &startLog{done: make(chan struct{})}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer close(l.done)
		if l.err = m.beginTrajectory(ctx, owner, rec, o); l.err != nil {
			return
		}
		l.began = true
		l.err = m.logCreate(ctx, rec, req, img)
	}()
	return l
}

// wait returns once the head and the create step are written (nil), or
// why not. A nil startLog (nothing to log) waits for nothing.
func (l *startLog) wait() error {
	if l == nil {
		return nil
	}
	<-l.done
	return l.err
}

// undo removes what a create that failed had logged: the head, if it was
// made (a name that another trajectory holds is left to it).
func (l *startLog) undo(m *Manager, rec store.SandboxRecord) {
	_ = l.wait()
	if l.began {
		m.abandonTrajectory(rec)
	}
}

// logCreate logs a new sandbox's spec as its trajectory's first step:
// the image by ID and its layers, so a resume builds the same root
// whatever names moved since; secret env values left out.
func (m *Manager) logCreate(ctx context.Context, rec store.SandboxRecord, req api.CreateSandboxRequest, img image.Resolved) error {
	r, err := m.recording(ctx, rec)
	if err != nil {
		return err
	}
	logged, secret := trajectory.Redact(req)
	logged.Image, logged.Layers, logged.Record = img.ID, nil, false
	logged.Trajectory = rec.Trajectory
	st := api.TrajectoryStep{Kind: api.KindCreate, Create: &api.StepCreate{Request: logged, SecretEnv: secret, FromSnapshot: req.FromSnapshot}}
	r.mu.Lock()
	defer r.mu.Unlock()
	return m.appendStep(ctx, r, rec, &st)
}

// trajectoryEnded logs how a recorded sandbox ended and marks its
// trajectory ended, unless another incarnation records to it already.
func (m *Manager) trajectoryEnded(rec store.SandboxRecord) {
	if m.traj == nil || rec.Trajectory == "" {
		return
	}
	done := make(chan struct{})
	m.recs.mu.Lock()
	m.recs.ending[rec.ID] = done
	m.recs.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.recs.mu.Lock()
			if m.recs.ending[rec.ID] == done {
				delete(m.recs.ending, rec.ID)
			}
			m.recs.mu.Unlock()
			close(done)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer m.dropRecording(rec.ID, nil)
		h, rev, err := m.traj.Head(ctx, rec.Trajectory)
		if err != nil || h.Sandbox != rec.ID || h.Incarnations != rec.Incarnation {
			return
		}
		// The head is written with the state and the counters (no Flush
		// of its own); if another incarnation took over, its appends and
		// lazy flush write them.
		ended := func(h *trajectory.Head) error {
			if h.Sandbox != rec.ID || h.State == api.TrajectoryResuming {
				return errNoChange // resumed meanwhile
			}
			if h.State != api.TrajectoryDiverged {
				h.State = api.TrajectoryEnded
			}
			h.UpdatedAt = time.Now().UTC()
			return nil
		}
		if r, rerr := m.recording(ctx, rec); rerr == nil && r != nil {
			// The end step and the head in one round trip (Finish).
			r.mu.Lock()
			st := api.TrajectoryStep{Kind: api.KindEnd, End: &api.StepEnd{Reason: rec.Reason}}
			m.stepFields(r, rec, &st)
			err = m.traj.Finish(ctx, r.traj, &st, h, rev, ended)
			if err == nil || errors.Is(err, errNoChange) {
				r.next++
			}
			r.mu.Unlock()
		} else {
			_, err = m.traj.MutateHead(ctx, rec.Trajectory, ended)
		}
		if err != nil && !errors.Is(err, errNoChange) {
			m.log.Warn("ending a trajectory", "trajectory", rec.Trajectory, "err", err)
		}
	}()
}

// waitEnded waits until the end of sandbox id's trajectory is logged, if
// it is being logged (in a goroutine: the caller of mutate may hold the
// recording's lock), or ctx ends.
func (m *Manager) waitEnded(ctx context.Context, id string) {
	m.recs.mu.Lock()
	done := m.recs.ending[id]
	m.recs.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// errNoChange leaves a head as it is (from a MutateHead function).
var errNoChange = errors.New("no change")
