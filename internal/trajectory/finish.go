package trajectory

import (
	"context"
	"errors"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Finish appends st, the last step of trajectory id, and writes the head
// as fn makes it from h, read at revision rev, with both writes in flight
// at once: ending a recorded sandbox waits for one round trip instead of
// an append, a read and an update in turn. The head is written with the
// counters the log has once st is in it (if the append fails the head
// counts one step more than the log, an error the caller is told of). A
// head changed since rev (a lazy flush of the counters) is re-read and fn
// applied again after st is logged. If fn returns an error the head is
// left as it is, st is still appended, and Finish returns fn's error.
func (s *Store) Finish(ctx context.Context, id string, st *api.TrajectoryStep, h Head, rev uint64, fn func(*Head) error) error {
	b, err := encodeStep(id, st)
	if err != nil {
		return err
	}
	again, err := s.finishLocked(ctx, id, st.Step, b, h, rev, fn)
	if again {
		// After the append, outside t.mu (MutateHead merges the counters
		// under it).
		_, err = s.MutateHead(ctx, id, fn)
	}
	return err
}

// finishLocked is Finish under the trajectory's lock; again says the
// head changed since rev and is still to be written.
func (s *Store) finishLocked(ctx context.Context, id string, step int, b []byte, h Head, rev uint64, fn func(*Head) error) (again bool, err error) {
	t := s.traj(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := s.roomLocked(ctx, id, t, step, b); err != nil {
		if errors.Is(err, errLogged) {
			return true, nil // logged by an earlier try: the head is left to write
		}
		return false, err
	}
	ferr := fn(&h)
	var wrote chan error
	if ferr == nil {
		h.ID = id
		h.Steps = max(h.Steps, t.lastStep, step)
		h.Bytes = max(h.Bytes, t.bytes+int64(len(b)))
		wrote = make(chan error, 1)
		go func() {
			_, err := s.writeHead(ctx, h, rev)
			wrote <- err
		}()
	}
	perr := s.publishLocked(ctx, id, t, step, b)
	if wrote == nil {
		return false, errors.Join(perr, ferr)
	}
	werr := <-wrote // bounded: writeHead is one request within ctx
	if perr != nil {
		return false, errors.Join(perr, werr)
	}
	switch {
	case werr == nil:
		t.flushedStep, t.flushedBytes = max(t.flushedStep, h.Steps), max(t.flushedBytes, h.Bytes)
		if t.timer != nil && !t.dirty() {
			t.timer.Stop()
			t.timer = nil
		}
		return false, nil
	case errdefs.CodeOf(werr) == api.CodeTrajectoryChanged:
		return true, nil
	}
	return false, werr
}
