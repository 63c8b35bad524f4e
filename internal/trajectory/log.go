package trajectory

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// stepHeader carries a message's step number, so that finding a step
// reads headers, not JSON.
const stepHeader = "Dsec-Step"

// MaxPage is the most steps one Steps call returns.
const MaxPage = 1000

// Append logs step st of trajectory id and returns once JetStream has
// acknowledged it (stored, and replicated where there are replicas): an
// acknowledged step is never missing. Step numbers are the caller's:
// from 1, each above the last logged. st.Trajectory is set to id.
//
// Every publish expects the subject's last sequence to be the one this
// Store saw last (Nats-Expected-Last-Subject-Sequence), so two writers
// cannot interleave and no step is written twice. When the log moved
// (another writer, or this one's earlier publish whose acknowledgement
// was lost), the step already logged under st.Step is compared with st:
// the same bytes mean a retry of an append that was done, and succeed;
// anything else is Conflict trajectory_changed. A step that would take
// the trajectory past Options.MaxBytes is TooLarge trajectory_full and is
// not logged.
//
// A step must fit in one NATS message (1 MiB on a stock server): large
// outputs and file contents go to blobs (Outputs, PutBlob).
func (s *Store) Append(ctx context.Context, id string, st *api.TrajectoryStep) error {
	b, err := encodeStep(id, st)
	if err != nil {
		return err
	}
	t := s.traj(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := s.roomLocked(ctx, id, t, st.Step, b); err != nil {
		if errors.Is(err, errLogged) {
			return nil
		}
		return err
	}
	return s.publishLocked(ctx, id, t, st.Step, b)
}

// encodeStep checks st, a step of trajectory id, and encodes it.
func encodeStep(id string, st *api.TrajectoryStep) ([]byte, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	if st.Trajectory == "" {
		st.Trajectory = id
	}
	if st.Trajectory != id {
		return nil, fmt.Errorf("appending to %s: the step names trajectory %s", id, st.Trajectory)
	}
	if st.Step < 1 {
		return nil, fmt.Errorf("appending to %s: step number %d is below 1", id, st.Step)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encoding step: %w", err)
	}
	return b, nil
}

// errLogged says the step an append was given is logged already, the
// same (a retry): nothing is to be written.
var errLogged = errors.New("logged already")

// roomLocked checks that step, encoded as b, can be appended to id: the
// log is loaded, the step is new (a retry of the same step returns
// errLogged; a different one Conflict) and fits.
//
// Preconditions: t.mu must be held.
func (s *Store) roomLocked(ctx context.Context, id string, t *traj, step int, b []byte) error {
	if !t.loaded {
		if err := s.loadLocked(ctx, id, t); err != nil {
			return err
		}
	}
	if step <= t.lastStep {
		if err := s.loggedAlready(ctx, id, step, b); err != nil {
			return err
		}
		return errLogged
	}
	if t.bytes+int64(len(b)) > s.opt.MaxBytes {
		return full(id, s.opt.MaxBytes)
	}
	return nil
}

// publishLocked writes step, encoded as b, after the log's last step as
// this Store knows it, and advances t; errLogged is success.
//
// Preconditions: t.mu must be held; roomLocked passed.
func (s *Store) publishLocked(ctx context.Context, id string, t *traj, step int, b []byte) error {
	msg := &nats.Msg{Subject: subject(id), Data: b, Header: nats.Header{stepHeader: []string{strconv.Itoa(step)}}}
	var ack *jetstream.PubAck
	var err error
	for attempt := 0; ; attempt++ {
		ack, err = s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(StreamName), jetstream.WithExpectLastSequencePerSubject(t.lastSeq))
		if err == nil {
			break
		}
		if t.fresh && attempt == 0 && wrongSequence(err) {
			// Steps of an earlier trajectory of this name (see Begin).
			if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject(id))); err != nil {
				return fmt.Errorf("purging old steps of %s: %w", id, err)
			}
			continue
		}
		t.loaded = false // whether it was stored is unknown: reload before the next
		if !wrongSequence(err) {
			return fmt.Errorf("appending step %d to %s: %w", step, id, err)
		}
		known := t.lastStep
		if err := s.loadLocked(ctx, id, t); err != nil {
			return err
		}
		if step <= t.lastStep {
			return s.loggedAlready(ctx, id, step, b)
		}
		if t.lastStep < known && attempt == 0 {
			// The log shrank (its oldest steps aged out): nobody else
			// wrote, so publish again after the new last sequence.
			continue
		}
		return changed(id, fmt.Sprintf("was appended to by another writer (step %d is its last)", t.lastStep))
	}
	t.lastSeq, t.lastStep, t.fresh = ack.Sequence, step, false
	t.bytes += int64(len(b))
	s.scheduleLocked(id, t)
	return nil
}

func full(id string, max int64) error {
	return errdefs.New(errdefs.TooLarge, api.CodeTrajectoryFull, "trajectory %q is full (it may hold %d bytes)", id, max)
}

func wrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// loggedAlready answers an append of a step number the log has: nil if
// the logged step is b (a retry), Conflict otherwise.
func (s *Store) loggedAlready(ctx context.Context, id string, step int, b []byte) error {
	m, ok, err := s.locate(ctx, id, step-1)
	if err != nil {
		return err
	}
	if ok && m.step == step && bytes.Equal(m.data, b) {
		return nil
	}
	return changed(id, fmt.Sprintf("has a different step %d logged already", step))
}

// Room reports whether trajectory id can take another step:
// TooLarge trajectory_full once it holds Options.MaxBytes. Callers ask
// before running a step, so a step that cannot be logged is not run.
func (s *Store) Room(ctx context.Context, id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	t := s.traj(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.loaded {
		if err := s.loadLocked(ctx, id, t); err != nil {
			return err
		}
	}
	if t.bytes >= s.opt.MaxBytes {
		return full(id, s.opt.MaxBytes)
	}
	return nil
}

// rawStep is a logged message: its stream sequence, step number and
// bytes.
type rawStep struct {
	seq  uint64
	step int
	data []byte
}

func decodeRaw(seq uint64, h nats.Header, data []byte) (rawStep, error) {
	r := rawStep{seq: seq, data: data}
	n, err := strconv.Atoi(h.Get(stepHeader))
	if err != nil {
		var st api.TrajectoryStep
		if err := json.Unmarshal(data, &st); err != nil {
			return r, fmt.Errorf("decoding step at sequence %d: %w", seq, err)
		}
		n = st.Step
	}
	r.step = n
	return r, nil
}

// lastMsg reads id's last logged message.
func (s *Store) lastMsg(ctx context.Context, id string) (rawStep, bool, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, subject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rawStep{}, false, nil
	}
	if err != nil {
		return rawStep{}, false, fmt.Errorf("reading the log of %s: %w", id, err)
	}
	r, err := decodeRaw(m.Sequence, m.Header, m.Data)
	return r, err == nil, err
}

// nextMsg reads id's first message at stream sequence seq or later.
func (s *Store) nextMsg(ctx context.Context, id string, seq uint64) (rawStep, bool, error) {
	m, err := s.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject(id)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rawStep{}, false, nil
	}
	if err != nil {
		return rawStep{}, false, fmt.Errorf("reading the log of %s: %w", id, err)
	}
	r, err := decodeRaw(m.Sequence, m.Header, m.Data)
	return r, err == nil, err
}

// locate finds id's first logged step numbered above after, without
// reading the log from its start: a binary search over stream sequences,
// each probe one get of the subject's next message at or after a
// sequence (O(log n) gets for a stream of n messages). Steps increase
// along the subject, so the probe's step number says which half holds
// the answer.
func (s *Store) locate(ctx context.Context, id string, after int) (rawStep, bool, error) {
	first, ok, err := s.nextMsg(ctx, id, 1)
	if err != nil || !ok || first.step > after {
		return first, ok, err
	}
	last, ok, err := s.lastMsg(ctx, id)
	if err != nil || !ok || last.step <= after {
		return rawStep{}, false, err
	}
	// next(lo) has a step ≤ after; next(hi) = hit has one above.
	lo, hi, hit := first.seq, last.seq, last
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		m, ok, err := s.nextMsg(ctx, id, mid)
		if err != nil {
			return rawStep{}, false, err
		}
		switch {
		case !ok: // deleted meanwhile: the log moved under us
			return rawStep{}, false, changed(id, "was deleted while it was read")
		case m.step > after:
			hi, hit = mid, m
		default:
			lo = m.seq
		}
	}
	return hit, true, nil
}

// Last returns id's last logged step, and false if it has none (used
// after a restart to find where a trajectory stands).
func (s *Store) Last(ctx context.Context, id string) (api.TrajectoryStep, bool, error) {
	var st api.TrajectoryStep
	if err := ValidID(id); err != nil {
		return st, false, err
	}
	m, ok, err := s.lastMsg(ctx, id)
	if err != nil || !ok {
		return st, false, err
	}
	if err := json.Unmarshal(m.data, &st); err != nil {
		return st, false, fmt.Errorf("decoding step %d of %s: %w", m.step, id, err)
	}
	return st, true, nil
}

// Steps returns up to limit of id's steps in order, the first numbered
// above after (limit ≤ 0 or above MaxPage: MaxPage). NotFound if id has
// no head. The page's start is found by locate, so page 10 of a long log
// costs a few gets, not a read of the nine before it.
func (s *Store) Steps(ctx context.Context, id string, after, limit int) ([]api.TrajectoryStep, error) {
	if limit <= 0 || limit > MaxPage {
		limit = MaxPage
	}
	if _, _, err := s.readHead(ctx, id); err != nil {
		return nil, err
	}
	out := []api.TrajectoryStep{}
	first, ok, err := s.locate(ctx, id, after)
	if err != nil || !ok {
		return out, err
	}
	err = s.read(ctx, id, first.seq, limit, func(m rawStep) error {
		var st api.TrajectoryStep
		if err := json.Unmarshal(m.data, &st); err != nil {
			return fmt.Errorf("decoding step %d of %s: %w", m.step, id, err)
		}
		out = append(out, st)
		return nil
	})
	return out, err
}

// Export writes every logged step of id to w as one JSON line each
// (JSONL), in order. NotFound if id has no head.
func (s *Store) Export(ctx context.Context, id string, w io.Writer) error {
	if _, _, err := s.readHead(ctx, id); err != nil {
		return err
	}
	first, ok, err := s.nextMsg(ctx, id, 1)
	if err != nil || !ok {
		return err
	}
	bw := bufio.NewWriter(w)
	err = s.read(ctx, id, first.seq, -1, func(m rawStep) error {
		bw.Write(m.data)
		return bw.WriteByte('\n') // a write's error sticks: the last one reports it
	})
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return fmt.Errorf("exporting %s: %w", id, err)
	}
	return nil
}

// read calls fn with id's messages from stream sequence start on, in
// order, up to limit (< 0: all there are when it starts). An ephemeral
// consumer delivers them in batches; it knows how many are pending, so
// no fetch waits for messages that will not come.
func (s *Store) read(ctx context.Context, id string, start uint64, limit int, fn func(rawStep) error) error {
	cons, err := s.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		FilterSubject:     subject(id),
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return fmt.Errorf("reading the log of %s: %w", id, err)
	}
	defer func() {
		// Not ctx: the consumer goes even if the caller gave up.
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	n := int(cons.CachedInfo().NumPending)
	if limit >= 0 {
		n = min(n, limit)
	}
	for n > 0 {
		batch, err := cons.Fetch(min(n, 256), jetstream.FetchContext(ctx))
		if err != nil {
			return fmt.Errorf("reading the log of %s: %w", id, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("reading the log of %s: %w", id, err)
			}
			r, err := decodeRaw(md.Sequence.Stream, m.Headers(), m.Data())
			if err != nil {
				return err
			}
			if err := fn(r); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("reading the log of %s: %w", id, err)
		}
		if got == 0 { // purged meanwhile
			return nil
		}
		n -= got
	}
	return nil
}
