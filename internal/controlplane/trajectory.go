package controlplane

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/trajectory"
)

// Trajectories: a sandbox created with one appends every interaction to
// its log (internal/trajectory) before the API answers. The steps of a
// recorded sandbox run one at a time, in the order they arrive: a log is
// a sequence, and a replay must meet the same order. Reads (files, stats,
// processes) are not steps and are not held up.

// trajectoryLog is the trajectory store (*trajectory.Store).
type trajectoryLog interface {
	Begin(ctx context.Context, h trajectory.Head) error
	Head(ctx context.Context, id string) (trajectory.Head, uint64, error)
	// MutateHead applies fn to the head and writes it back, retrying
	// when another writer (the store's own counter flush) got there first.
	MutateHead(ctx context.Context, id string, fn func(*trajectory.Head) error) (trajectory.Head, error)
	// Finish appends a trajectory's last step and writes its head as fn
	// makes it from h (at revision rev) at once.
	Finish(ctx context.Context, id string, st *api.TrajectoryStep, h trajectory.Head, rev uint64, fn func(*trajectory.Head) error) error
	Flush(ctx context.Context, id string) error
	Room(ctx context.Context, id string) error
	Append(ctx context.Context, id string, st *api.TrajectoryStep) error
	Last(ctx context.Context, id string) (api.TrajectoryStep, bool, error)
	Steps(ctx context.Context, id string, after, limit int) ([]api.TrajectoryStep, error)
	Export(ctx context.Context, id string, w io.Writer) error
	List(ctx context.Context, owner, after string, limit int) ([]trajectory.Head, string, error)
	Delete(ctx context.Context, id string) error
	PutBlob(ctx context.Context, id string, r io.Reader) (string, int64, error)
	Blob(ctx context.Context, id, digest string) (io.ReadCloser, int64, error)
	Outputs(ctx context.Context, id string, res api.ExecResult, inlineMax int) (api.StepExec, error)
}

// recording is a recorded sandbox's place in its trajectory.
type recording struct {
	// mu is held for the whole of a step.
	mu   sync.Mutex
	traj string
	// next is the number of the next step (guarded by mu).
	next int
	// ff, while not nil, answers requests that match the log from it
	// (a resumed sandbox whose harness starts its loop again).
	ff *fastForward

	// amu guards abort, the cancel of the exec in flight: a preemption
	// calls it while that exec holds mu.
	amu   sync.Mutex
	abort context.CancelCauseFunc
}

// errPreempted ends the exec in flight of a sandbox whose node was lost.
var errPreempted = errors.New("the sandbox's node was lost")

func (r *recording) setAbort(f context.CancelCauseFunc) {
	r.amu.Lock()
	r.abort = f
	r.amu.Unlock()
}

// abortStep cancels the exec in flight, if any, with cause.
func (r *recording) abortStep(cause error) {
	r.amu.Lock()
	defer r.amu.Unlock()
	if r.abort != nil {
		r.abort(cause)
	}
}

// recordings holds the recordings of this process's recorded sandboxes.
type recordings struct {
	mu sync.Mutex // guards m and ending
	m  map[string]*recording
	// ending holds, by sandbox ID, a channel closed once the end of the
	// sandbox's trajectory is logged (trajectoryEnded), so that a delete
	// answers after it.
	ending map[string]chan struct{}
}

// recording returns rec's recording, loading where its trajectory stands
// from the log the first time this process sees it (after a restart, or
// a sandbox created by another server). It returns nil for a sandbox
// without a trajectory.
func (m *Manager) recording(ctx context.Context, rec store.SandboxRecord) (*recording, error) {
	if rec.Trajectory == "" {
		return nil, nil
	}
	if m.traj == nil {
		return nil, noTrajectories()
	}
	m.recs.mu.Lock()
	r := m.recs.m[rec.ID]
	if r == nil {
		r = &recording{traj: rec.Trajectory}
		m.recs.m[rec.ID] = r
	}
	m.recs.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next == 0 {
		last, ok, err := m.traj.Last(ctx, rec.Trajectory)
		if err != nil {
			return nil, err
		}
		r.next = 1
		if ok {
			r.next = last.Step + 1
		}
	}
	return r, nil
}

// dropRecording forgets a sandbox's recording (it ended, or is being
// resumed), ending the exec it has in flight with cause (if not nil).
func (m *Manager) dropRecording(id string, cause error) {
	m.recs.mu.Lock()
	r := m.recs.m[id]
	delete(m.recs.m, id)
	m.recs.mu.Unlock()
	if r != nil && cause != nil {
		r.abortStep(cause)
	}
}

func noTrajectories() error {
	return errdefs.New(errdefs.Unsupported, api.CodeNoTrajectoryStore, "this server keeps no trajectories")
}

// appendStep appends st as r's next step (r.mu held) and advances r. A
// step the log could not take fails the request: the caller must not
// believe a step is recorded that is not.
func (m *Manager) appendStep(ctx context.Context, r *recording, rec store.SandboxRecord, st *api.TrajectoryStep) error {
	m.stepFields(r, rec, st)
	if err := m.traj.Append(context.WithoutCancel(ctx), r.traj, st); err != nil {
		return err
	}
	r.next++
	return nil
}

// stepFields fills in st's place: r's trajectory and next step, rec's
// sandbox, and the time if unset (r.mu held).
func (m *Manager) stepFields(r *recording, rec store.SandboxRecord, st *api.TrajectoryStep) {
	st.Trajectory = r.traj
	st.Step = r.next
	st.Sandbox = rec.ID
	if st.At.IsZero() {
		st.At = time.Now().UTC()
	}
}

// stepped runs one non-exec step of a recorded sandbox: do makes the
// change, then the step is logged. Without a trajectory do just runs.
func (m *Manager) stepped(ctx context.Context, rec store.SandboxRecord, st api.TrajectoryStep, do func(step int) error) error {
	r, err := m.recording(ctx, rec)
	if err != nil {
		return err
	}
	if r == nil {
		return do(0)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ff != nil {
		if r.ff.match(&st) {
			return nil
		}
		r.ff = nil
	}
	if err := m.traj.Room(ctx, r.traj); err != nil {
		return err
	}
	start := time.Now()
	if err := do(r.next); err != nil {
		return err
	}
	st.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	return m.appendStep(ctx, r, rec, &st)
}

// fastForwardPast reports whether st is a resumed sandbox's next logged
// step, and moves past it (what it did is done already); a request that
// differs ends the fast-forward.
func (m *Manager) fastForwardPast(ctx context.Context, rec store.SandboxRecord, st api.TrajectoryStep) bool {
	r, err := m.recording(ctx, rec)
	if err != nil || r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ff == nil {
		return false
	}
	if r.ff.match(&st) {
		return true
	}
	r.ff = nil
	return false
}
