package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Serve serves the protocol on conn (agent side) until the connection
// ends or ctx is done, calling handle for every call in a goroutine of
// its own; a panic in handle fails that call (errdefs.Internal
// "agent_panic") rather than the process. It closes conn, cancels the calls still running and waits for
// their handlers to return before it returns. It returns nil when the
// node closed the connection, ctx's error when ctx ended, and the error
// otherwise (a protocol violation: errdefs.Unavailable
// "agent_protocol_error", an I/O error).
func Serve(ctx context.Context, conn io.ReadWriteCloser, logger *slog.Logger, handle func(*Call)) error {
	s := newSession(conn, logger, true)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var calls sync.WaitGroup
	s.onOpen = func(st *stream, req Request) {
		cctx, ccancel := context.WithCancel(sctx)
		st.mu.Lock()
		st.cancel = ccancel
		st.mu.Unlock()
		c := &Call{Op: req.Op, args: req.Args, st: st, ctx: cctx}
		calls.Add(1)
		go func() {
			defer calls.Done()
			defer ccancel()
			defer st.forget()
			defer func() {
				// As PID 1 a crash would end the sandbox: a bug in one call
				// fails that call, as net/http does for a request.
				if v := recover(); v != nil {
					s.logger.Error("panic serving a call", "op", c.Op, "panic", v, "stack", string(debug.Stack()))
					c.Reply(nil, errdefs.New(errdefs.Internal, api.CodeAgentPanic, "the agent failed serving the %s call", c.Op))
				}
			}()
			handle(c)
			if !c.replied {
				c.Reply(nil, errdefs.New(errdefs.Internal, api.CodeNoReply, "the agent did not answer the %s call", c.Op))
			}
		}()
	}
	s.start()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.end(ctx.Err())
	}
	cancel()
	calls.Wait()
	s.wg.Wait()
	var e *errdefs.Error
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(s.err, &e):
		return s.err
	case errors.Is(s.err, io.EOF) || errors.Is(s.err, io.ErrUnexpectedEOF) ||
		errors.Is(s.err, syscall.ECONNRESET) || errors.Is(s.err, syscall.EPIPE):
		return nil
	}
	return s.err
}

// Call is one call being served by the agent. Its methods are for the
// handler's goroutines: Recv from one goroutine at a time, Send from any,
// and Reply once, after the last Send.
type Call struct {
	Op      string
	args    json.RawMessage
	st      *stream
	ctx     context.Context
	replied bool
}

// Context is done when the node cancels the call or the connection ends.
func (c *Call) Context() context.Context { return c.ctx }

// Decode decodes the call's arguments into v.
func (c *Call) Decode(v any) error {
	if len(c.args) == 0 {
		return nil
	}
	if err := decodeJSON(c.args, v); err != nil {
		return errdefs.Wrap(errdefs.Invalid, api.CodeBadRequest, err, "undecodable %s arguments", c.Op)
	}
	return nil
}

// Recv returns the next chunk of data the node sends on ChanIn, and
// io.EOF after the last one. ctx should derive from Context.
func (c *Call) Recv(ctx context.Context) ([]byte, error) {
	for {
		f, err := c.st.next(ctx, 0)
		if err != nil {
			return nil, err
		}
		if len(f.Payload) > 0 {
			if f.Flags&FlagEOF != 0 {
				// Deliver the data; EOF follows on the next Recv.
				c.st.mu.Lock()
				c.st.queue = append([]Frame{{Type: FrameData, Flags: FlagEOF, Stream: f.Stream}}, c.st.queue...)
				c.st.mu.Unlock()
			}
			return f.Payload, nil
		}
		if f.Flags&FlagEOF != 0 {
			return nil, io.EOF
		}
	}
}

// Send sends p on channel ch, waiting for the node's window. It takes
// ownership of p.
func (c *Call) Send(ch Channel, p []byte) error {
	return c.st.sendData(c.ctx, 0, ch, p, false)
}

// Event sends v as an Event frame.
func (c *Call) Event(v any) error {
	payload, err := encodeJSON(v)
	if err != nil {
		return err
	}
	if len(payload) > MaxControlPayload {
		return errdefs.New(errdefs.Internal, api.CodeEventTooLarge, "event of %d bytes", len(payload))
	}
	return c.st.s.enqueue(c.ctx, Frame{Type: FrameEvent, Stream: c.st.id, Payload: payload})
}

// Reply ends the call with result, or with err if it is not nil. It is
// sent even if the call was cancelled, as long as the connection lives.
func (c *Call) Reply(result any, err error) error {
	if c.replied {
		return nil
	}
	c.replied = true
	var r Reply
	if err != nil {
		r.Error = EncodeError(err)
	} else if result != nil {
		raw, err := encodeJSON(result)
		if err != nil {
			r.Error = EncodeError(err)
		} else {
			r.Result = raw
		}
	}
	payload, err := encodeJSON(r)
	if err == nil && len(payload) > MaxPayload {
		payload, err = encodeJSON(Reply{Error: EncodeError(errdefs.New(errdefs.TooLarge, api.CodeReplyTooLarge, "the %s reply is %d bytes, more than %d", c.Op, len(payload), MaxPayload))})
	}
	if err != nil {
		return err
	}
	return c.st.s.enqueue(context.Background(), Frame{Type: FrameReply, Stream: c.st.id, Payload: payload})
}
