package agentproto

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Bounds on what a peer may queue on one call before its consumer reads
// it: data is bounded by the window; these bound the rest.
const (
	maxQueuedControl = 8    // events and replies waiting on one call
	maxCalls         = 1024 // concurrent calls the agent serves per connection
	outQueue         = 64   // frames waiting for the writer
	ioBufferSize     = 16 << 10
)

// errPeerEnded stops sending data on a call the peer has ended: its
// reply says why.
var errPeerEnded = errors.New("the call has ended")

// errGone is the error of calls on a session whose connection ended.
func errGone(cause error) error {
	return errdefs.Wrap(errdefs.Unavailable, api.CodeAgentGone, cause, "the sandbox agent's connection is closed")
}

// violation is a peer breaking the protocol; the session ends with it.
func violation(format string, args ...any) error {
	return errdefs.New(errdefs.Unavailable, api.CodeAgentProtocolError, "the sandbox agent broke the protocol: "+format, args...)
}

// session is one multiplexed connection, on either end. One goroutine
// reads frames and files them into their calls' queues without ever
// blocking on a consumer; another writes the frames callers queue. A call
// whose consumer is slow only fills its own queue, which the window
// bounds, so it cannot stall the connection or other calls.
type session struct {
	conn   io.ReadWriteCloser
	logger *slog.Logger
	server bool
	out    chan Frame
	done   chan struct{} // closed when the session ends
	wg     sync.WaitGroup

	// onOpen serves a new call (agent side only). It is called from the
	// reader goroutine and must not block.
	onOpen func(st *stream, req Request)

	endOnce sync.Once
	err     error // why the session ended; set before done is closed

	cancelWake chan struct{} // signalled when cancels grows

	mu      sync.Mutex // guards following fields
	streams map[uint32]*stream
	nextID  uint32
	cancels []uint32 // calls to send a Cancel frame for
}

func newSession(conn io.ReadWriteCloser, logger *slog.Logger, server bool) *session {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &session{
		conn:       conn,
		logger:     logger,
		server:     server,
		out:        make(chan Frame, outQueue),
		done:       make(chan struct{}),
		cancelWake: make(chan struct{}, 1),
		streams:    map[uint32]*stream{},
	}
}

func (s *session) start() {
	s.wg.Add(2)
	go s.readLoop()
	go s.writeLoop()
}

// end closes the session with err (the first error wins).
func (s *session) end(err error) {
	s.endOnce.Do(func() {
		s.err = err
		close(s.done)
		s.conn.Close()
	})
}

// failure is the error calls on an ended session return.
// Preconditions: s.done is closed.
func (s *session) failure() error {
	var e *errdefs.Error
	if errors.As(s.err, &e) {
		return s.err
	}
	return errGone(s.err)
}

// enqueue hands f to the writer. The frame's payload then belongs to the
// writer.
func (s *session) enqueue(ctx context.Context, f Frame) error {
	select {
	case <-s.done:
		return s.failure()
	default:
	}
	if ctx.Err() != nil {
		return ctxError(ctx)
	}
	select {
	case s.out <- f:
		return nil
	case <-s.done:
		return s.failure()
	case <-ctx.Done():
		return ctxError(ctx)
	}
}

func (s *session) writeLoop() {
	defer s.wg.Done()
	bw := bufio.NewWriterSize(s.conn, ioBufferSize)
	var hdr [HeaderSize]byte
	write := func(f Frame) error {
		if _, err := bw.Write(f.AppendHeader(hdr[:0])); err != nil {
			return err
		}
		_, err := bw.Write(f.Payload)
		return err
	}
	for {
		var (
			f   Frame
			err error
		)
		select {
		case f = <-s.out:
			err = write(f)
		case <-s.cancelWake:
		case <-s.done:
			return
		}
		drain := func() {
			for err == nil {
				select {
				case f = <-s.out:
					err = write(f)
				default:
					return
				}
			}
		}
		drain()
		s.mu.Lock()
		cancels := s.cancels
		s.cancels = nil
		s.mu.Unlock()
		if len(cancels) > 0 {
			// A cancelled call's Open was queued before its Cancel was
			// asked for: drain again so that it goes first.
			drain()
			for _, id := range cancels {
				if err == nil {
					err = write(Frame{Type: FrameCancel, Stream: id})
				}
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			s.end(err)
			return
		}
	}
}

func (s *session) readLoop() {
	defer s.wg.Done()
	br := bufio.NewReaderSize(s.conn, ioBufferSize)
	var hdr [HeaderSize]byte
	for {
		f, err := ReadFrame(br, &hdr)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				err = violation("%v", err)
			}
			s.end(err)
			return
		}
		if err := s.dispatch(f); err != nil {
			s.logger.Warn("agent protocol violation", "err", err)
			s.end(err)
			return
		}
	}
}

// dispatch files one frame. It never blocks.
func (s *session) dispatch(f Frame) error {
	if f.Type == FrameOpen {
		if !s.server {
			return violation("the agent opened a call")
		}
		var req Request
		if err := decodeJSON(f.Payload, &req); err != nil {
			return violation("undecodable request: %v", err)
		}
		s.mu.Lock()
		if _, dup := s.streams[f.Stream]; dup {
			s.mu.Unlock()
			return violation("call %d opened twice", f.Stream)
		}
		if len(s.streams) >= maxCalls {
			s.mu.Unlock()
			payload, _ := encodeJSON(Reply{Error: EncodeError(errdefs.New(errdefs.RateLimited, api.CodeTooManyCalls, "more than %d calls at once on one connection", maxCalls))})
			// The writer may be stalled; refusing must not stall the reader.
			select {
			case s.out <- Frame{Type: FrameReply, Stream: f.Stream, Payload: payload}:
			default:
			}
			return nil
		}
		st := newStream(s, f.Stream)
		s.streams[f.Stream] = st
		s.mu.Unlock()
		s.onOpen(st, req)
		return nil
	}
	s.mu.Lock()
	st := s.streams[f.Stream]
	s.mu.Unlock()
	if st == nil {
		// A call this end already finished or abandoned; frames in flight
		// when it did are dropped.
		return nil
	}
	return st.receive(f)
}

// open starts a call (node side).
func (s *session) open(ctx context.Context, op string, args any) (*stream, error) {
	req := Request{Op: op}
	if args != nil {
		raw, err := encodeJSON(args)
		if err != nil {
			return nil, err
		}
		req.Args = raw
	}
	payload, err := encodeJSON(req)
	if err != nil {
		return nil, err
	}
	if len(payload) > MaxPayload {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeRequestTooLarge, "the %s request is %d bytes, more than %d", op, len(payload), MaxPayload)
	}
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		return nil, s.failure()
	default:
	}
	for {
		s.nextID++
		if s.nextID == 0 {
			s.nextID = 1
		}
		if _, used := s.streams[s.nextID]; !used {
			break
		}
	}
	st := newStream(s, s.nextID)
	s.streams[st.id] = st
	s.mu.Unlock()
	if err := s.enqueue(ctx, Frame{Type: FrameOpen, Stream: st.id, Payload: payload}); err != nil {
		st.forget()
		return nil, err
	}
	return st, nil
}

// stream is one call's state on either end.
type stream struct {
	id uint32
	s  *session

	recvWake   chan struct{} // signalled when a frame is queued
	creditWake chan struct{} // signalled when the peer grants credit
	endedCh    chan struct{} // closed when the peer ends the call

	mu        sync.Mutex // guards following fields
	queue     []Frame    // received and not yet consumed
	queuedCtl int        // events and replies in queue
	recvLeft  int64      // data the peer may still send us
	ungranted int64      // data consumed and not yet granted back
	sendLeft  int64      // data we may still send
	eof       [3]bool    // EOF received per channel
	ended     bool       // the peer ended the call (Reply, or Cancel)
	cancel    func()     // agent side: cancels the call's context
}

func newStream(s *session, id uint32) *stream {
	return &stream{
		id:         id,
		s:          s,
		recvWake:   make(chan struct{}, 1),
		creditWake: make(chan struct{}, 1),
		endedCh:    make(chan struct{}),
		recvLeft:   InitialWindow,
		sendLeft:   InitialWindow,
	}
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// receive files a frame for this call. Called by the reader goroutine.
func (st *stream) receive(f Frame) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch f.Type {
	case FrameWindow:
		st.sendLeft += int64(binary.BigEndian.Uint32(f.Payload))
		if st.sendLeft > MaxWindow {
			return violation("window of call %d grew past %d bytes", st.id, MaxWindow)
		}
		wake(st.creditWake)
		return nil
	case FrameCancel:
		if !st.s.server {
			return violation("the agent cancelled call %d", st.id)
		}
		if !st.ended {
			st.ended = true
			close(st.endedCh)
		}
		if st.cancel != nil {
			st.cancel()
		}
		return nil
	case FrameData:
		if (f.Channel == ChanIn) != st.s.server {
			return violation("data on channel %d in the wrong direction", f.Channel)
		}
		if st.eof[f.Channel] {
			return violation("data on channel %d of call %d after its end", f.Channel, st.id)
		}
		if int64(len(f.Payload)) > st.recvLeft {
			return violation("call %d sent %d bytes with %d bytes of window", st.id, len(f.Payload), st.recvLeft)
		}
		st.recvLeft -= int64(len(f.Payload))
		if f.Flags&FlagEOF != 0 {
			st.eof[f.Channel] = true
		}
	case FrameEvent, FrameReply:
		if st.s.server {
			return violation("the node sent a %s frame", f.Type)
		}
		if st.ended {
			return violation("call %d: %s after the reply", st.id, f.Type)
		}
		if st.queuedCtl >= maxQueuedControl {
			return violation("call %d: more than %d unread events", st.id, maxQueuedControl)
		}
		st.queuedCtl++
		if f.Type == FrameReply {
			st.ended = true
			close(st.endedCh)
		}
	default:
		return violation("unexpected %s frame on call %d", f.Type, st.id)
	}
	st.queue = append(st.queue, f)
	wake(st.recvWake)
	return nil
}

// next returns the call's next received frame, waiting for it up to ctx
// and, if idle > 0, for at most idle. Data it returns is granted back to
// the peer: the window bounds what is queued, not what is being
// processed.
func (st *stream) next(ctx context.Context, idle time.Duration) (Frame, error) {
	var timer <-chan time.Time
	for {
		st.mu.Lock()
		if len(st.queue) > 0 {
			f := st.queue[0]
			st.queue[0] = Frame{}
			st.queue = st.queue[1:]
			var grant int64
			if f.Type == FrameData {
				st.ungranted += int64(len(f.Payload))
				if st.ungranted >= InitialWindow/4 {
					grant, st.ungranted = st.ungranted, 0
					st.recvLeft += grant
				}
			} else {
				st.queuedCtl--
			}
			st.mu.Unlock()
			if grant > 0 {
				if err := st.s.enqueue(ctx, Frame{Type: FrameWindow, Stream: st.id, Payload: windowPayload(uint32(grant))}); err != nil {
					return Frame{}, err
				}
			}
			return f, nil
		}
		st.mu.Unlock()
		if timer == nil && idle > 0 {
			t := time.NewTimer(idle)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-st.recvWake:
		case <-st.s.done:
			// Frames queued before the end are still delivered.
			st.mu.Lock()
			n := len(st.queue)
			st.mu.Unlock()
			if n == 0 {
				return Frame{}, st.s.failure()
			}
		case <-ctx.Done():
			return Frame{}, ctxError(ctx)
		case <-timer:
			return Frame{}, errdefs.New(errdefs.DeadlineExceeded, api.CodeAgentTimeout, "the sandbox agent sent nothing for %v", idle)
		}
	}
}

// sendData sends p on channel ch within the peer's window, in chunks,
// and with FlagEOF on the last one if eof. It takes ownership of p.
func (st *stream) sendData(ctx context.Context, idle time.Duration, ch Channel, p []byte, eof bool) error {
	var timer <-chan time.Time
	for {
		select {
		case <-st.endedCh:
			return errPeerEnded
		default:
		}
		if len(p) == 0 && eof {
			return st.s.enqueue(ctx, Frame{Type: FrameData, Channel: ch, Flags: FlagEOF, Stream: st.id})
		}
		if len(p) == 0 {
			return nil
		}
		st.mu.Lock()
		n := min(int64(len(p)), st.sendLeft, ChunkSize)
		st.sendLeft -= n
		st.mu.Unlock()
		if n > 0 {
			f := Frame{Type: FrameData, Channel: ch, Stream: st.id, Payload: p[:n:n]}
			p = p[n:]
			if len(p) == 0 && eof {
				f.Flags = FlagEOF
				eof = false
			}
			if err := st.s.enqueue(ctx, f); err != nil {
				return err
			}
			timer = nil
			continue
		}
		if timer == nil && idle > 0 {
			t := time.NewTimer(idle)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-st.creditWake:
		case <-st.endedCh:
			return errPeerEnded
		case <-st.s.done:
			return st.s.failure()
		case <-ctx.Done():
			return ctxError(ctx)
		case <-timer:
			return errdefs.New(errdefs.DeadlineExceeded, api.CodeAgentTimeout, "the sandbox agent took no data for %v", idle)
		}
	}
}

// forget removes the call from its session; later frames for it are
// dropped.
func (st *stream) forget() {
	st.s.mu.Lock()
	if st.s.streams[st.id] == st {
		delete(st.s.streams, st.id)
	}
	st.s.mu.Unlock()
}

// abandon gives up a call the peer has not ended: the agent is asked to
// stop it, without waiting (node side).
func (st *stream) abandon() {
	st.forget()
	st.mu.Lock()
	ended := st.ended
	st.mu.Unlock()
	if ended {
		return
	}
	// Never blocking: the writer sends it after the frames already queued.
	st.s.mu.Lock()
	st.s.cancels = append(st.s.cancels, st.id)
	st.s.mu.Unlock()
	wake(st.s.cancelWake)
}

func ctxError(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return errdefs.Wrap(errdefs.DeadlineExceeded, api.CodeDeadlineExceeded, err, "the call to the sandbox agent ran out of time")
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}
