package trajectory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// traj is what this Store knows of one trajectory between its writes:
// where its log ends (for the expected-sequence check of the next append)
// and its counters, flushed to the head lazily.
type traj struct {
	mu sync.Mutex // serialises the trajectory's appends here; guards following fields
	// loaded: lastSeq and lastStep are what the log held when last seen.
	loaded   bool
	lastSeq  uint64 // stream sequence of the last step, 0 for none
	lastStep int
	bytes    int64
	// The counters as last written to the head.
	flushedStep  int
	flushedBytes int64
	timer        *time.Timer // a flush is due
	// fresh: begun here and nothing appended yet, so steps found on its
	// subject are an earlier trajectory's of the same name (see Begin).
	fresh bool

	got time.Time // when a caller last took it; guarded by Store.mu
}

// reset forgets what is known of the log; the next append reloads it.
func (t *traj) reset() {
	t.loaded, t.lastSeq, t.lastStep, t.bytes = false, 0, 0, 0
	t.flushedStep, t.flushedBytes = 0, 0
	t.fresh = false
}

func (t *traj) dirty() bool { return t.lastStep > t.flushedStep || t.bytes > t.flushedBytes }

// maxIdle trajectories are kept in memory; past it, idle clean ones go.
const maxIdle = 4096

// traj returns id's state, made on first use.
func (s *Store) traj(id string) *traj {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.trajs[id]
	if t == nil {
		if len(s.trajs) >= maxIdle && time.Since(s.swept) > 10*time.Second {
			s.swept = time.Now()
			s.evictLocked()
		}
		t = &traj{}
		s.trajs[id] = t
	}
	t.got = time.Now()
	return t
}

// evictLocked drops the state of trajectories with nothing to flush that
// no caller took for a minute (one that holds it will have locked it by
// then); their next append reloads it.
func (s *Store) evictLocked() {
	for id, t := range s.trajs {
		if !t.mu.TryLock() {
			continue
		}
		if !t.dirty() && t.timer == nil && time.Since(t.got) > time.Minute {
			delete(s.trajs, id)
		}
		t.mu.Unlock()
	}
}

// forget drops id's state (the trajectory was deleted).
func (s *Store) forget(id string) {
	s.mu.Lock()
	t := s.trajs[id]
	delete(s.trajs, id)
	s.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		if t.timer != nil {
			t.timer.Stop()
			t.timer = nil
		}
		t.reset()
		t.mu.Unlock()
	}
}

// loadLocked learns where id's log ends and what its head counts.
func (s *Store) loadLocked(ctx context.Context, id string, t *traj) error {
	h, _, err := s.readHead(ctx, id)
	if err != nil {
		return err
	}
	last, ok, err := s.lastMsg(ctx, id)
	if err != nil {
		return err
	}
	t.lastSeq, t.lastStep = 0, 0
	if ok {
		t.lastSeq, t.lastStep = last.seq, last.step
	}
	t.bytes = max(t.bytes, h.Bytes)
	t.flushedStep, t.flushedBytes = h.Steps, h.Bytes
	t.loaded = true
	return nil
}

// mergeCounters raises h's counters to what this Store knows.
func (s *Store) mergeCounters(h *Head) {
	s.mu.Lock()
	t := s.trajs[h.ID]
	s.mu.Unlock()
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.loaded {
		h.Steps = max(h.Steps, t.lastStep)
		h.Bytes = max(h.Bytes, t.bytes)
	}
	t.mu.Unlock()
}

// flushed records counters written to id's head.
func (s *Store) flushed(id string, steps int, bytes int64) {
	s.mu.Lock()
	t := s.trajs[id]
	s.mu.Unlock()
	if t == nil {
		return
	}
	t.mu.Lock()
	t.flushedStep = max(t.flushedStep, steps)
	t.flushedBytes = max(t.flushedBytes, bytes)
	t.mu.Unlock()
}

// scheduleLocked arms id's lazy flush unless one is due already.
func (s *Store) scheduleLocked(id string, t *traj) {
	if t.timer != nil || !t.dirty() {
		return
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return
	}
	t.timer = time.AfterFunc(flushEvery, func() {
		t.mu.Lock()
		t.timer = nil
		t.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Flush(ctx, id); err != nil && !errors.Is(err, errdefs.NotFound) {
			s.log.Warn("flushing trajectory head", "trajectory", id, "err", err)
		}
	})
}

// Flush writes id's counters to its head now if they moved since the
// last write. The control plane calls it when a trajectory ends; Close
// calls it for all.
func (s *Store) Flush(ctx context.Context, id string) error {
	s.mu.Lock()
	t := s.trajs[id]
	s.mu.Unlock()
	if t == nil {
		return nil
	}
	t.mu.Lock()
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	dirty := t.loaded && t.dirty()
	t.mu.Unlock()
	if !dirty {
		return nil
	}
	// MutateHead merges the counters in.
	if _, err := s.MutateHead(ctx, id, func(*Head) error { return nil }); err != nil {
		return fmt.Errorf("flushing trajectory %s: %w", id, err)
	}
	return nil
}

// Close flushes every trajectory's counters and stops the lazy flushes.
// The Store must not be used afterwards.
func (s *Store) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	ids := make([]string, 0, len(s.trajs))
	for id := range s.trajs {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := s.Flush(ctx, id); err != nil && !errors.Is(err, errdefs.NotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
