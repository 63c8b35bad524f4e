package agentproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Timeouts the client applies on its own, so that a silent agent cannot
// hang the node.
const (
	// DefaultCallTimeout bounds a short call (stat, signal, hello…) whose
	// context has no deadline, and how long a streaming call (Open, Write)
	// waits for the agent to make progress.
	DefaultCallTimeout = 30 * time.Second
	// DefaultExecTimeout is the command timeout when a request sets none
	// (the agent applies the same).
	DefaultExecTimeout = 60 * time.Second
	// ExecGrace is how long past a command's timeout the client waits for
	// the agent's answer when ctx has no deadline.
	ExecGrace = 30 * time.Second
	// maxStdinInline is the longest stdin string sent inside the request;
	// longer ones are streamed.
	maxStdinInline = 64 << 10
	// maxRememberedCaps bounds the output caps the client remembers for
	// background processes.
	maxRememberedCaps = 4096
)

var errClientClosed = errors.New("client closed")

// Client is the node's end of a connection to a sandbox agent. It is safe
// for concurrent use; calls are multiplexed on the one connection.
//
// The client treats the agent as hostile: frames and JSON are bounded,
// data beyond a call's window or past its output cap ends the connection
// or is dropped, every call is bounded by its context and, where the
// context has no deadline, by the client's own timeouts, and a closed
// connection fails all calls at once with an errdefs.Unavailable error
// (code "agent_gone"; "agent_protocol_error" if the agent broke the
// protocol).
type Client struct {
	s           *session
	callTimeout time.Duration

	mu    sync.Mutex  // guards following fields
	caps  map[int]int // output caps of background processes started here
	hello []string    // the capabilities the agent's hello announced
}

// NewClient starts a client on conn, a byte stream to the agent (a Unix
// socket, a virtio-serial port). The client owns conn: Close closes it,
// and closing conn must unblock its pending Read and Write. logger may be
// nil.
func NewClient(conn io.ReadWriteCloser, logger *slog.Logger) *Client {
	s := newSession(conn, logger, false)
	s.start()
	return &Client{s: s, callTimeout: DefaultCallTimeout, caps: map[int]int{}}
}

// Close closes the connection, failing the calls in progress, and waits
// for the client's goroutines to end.
func (c *Client) Close() error {
	c.s.end(errClientClosed)
	c.s.wg.Wait()
	return nil
}

// Done is closed when the connection ends, by Close or because the agent
// went away; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.s.done }

// Err returns why the connection ended, or nil while it lives.
func (c *Client) Err() error {
	select {
	case <-c.s.done:
		return c.s.failure()
	default:
		return nil
	}
}

// withTimeout bounds ctx by d unless it already has a deadline.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// decodeReply decodes a Reply frame into result, or returns its error. A
// reply that does not decode ends the session: the agent is broken.
func (c *Client) decodeReply(f Frame, result any) error {
	var r Reply
	if err := decodeJSON(f.Payload, &r); err != nil {
		return c.broken("undecodable reply: %v", err)
	}
	if r.Error != nil {
		return r.Error.Err()
	}
	if result != nil && len(r.Result) > 0 {
		if err := decodeJSON(r.Result, result); err != nil {
			return c.broken("undecodable result: %v", err)
		}
	}
	return nil
}

// broken ends the session because the agent misbehaved and returns the
// error calls see.
func (c *Client) broken(format string, args ...any) error {
	err := violation(format, args...)
	c.s.logger.Warn("closing the connection to a misbehaving agent", "err", err)
	c.s.end(err)
	return err
}

// unary makes a call that takes no data and returns only a reply.
func (c *Client) unary(ctx context.Context, op string, args, result any) error {
	ctx, cancel := withTimeout(ctx, c.callTimeout)
	defer cancel()
	st, err := c.s.open(ctx, op, args)
	if err != nil {
		return err
	}
	for {
		f, err := st.next(ctx, 0)
		if err != nil {
			st.abandon()
			return err
		}
		switch f.Type {
		case FrameReply:
			st.forget()
			return c.decodeReply(f, result)
		case FrameData:
			st.abandon()
			return c.broken("data on a %s call", op)
		}
		// Events are ignored on calls that expect none.
	}
}

// Hello checks that the agent speaks this protocol and returns what it
// says about itself.
func (c *Client) Hello(ctx context.Context) (Hello, error) {
	var h Hello
	if err := c.unary(ctx, OpHello, HelloArgs{Protocol: Protocol, Client: "dsec-node"}, &h); err != nil {
		return Hello{}, err
	}
	if h.Protocol != Protocol {
		return h, errdefs.New(errdefs.Unsupported, api.CodeAgentProtocolMismatch, "the sandbox agent speaks protocol %d, the node %d", h.Protocol, Protocol)
	}
	c.mu.Lock()
	c.hello = slices.Clone(h.Capabilities)
	c.mu.Unlock()
	return h, nil
}

// Stats returns the agent's report on itself and its sandbox; it is
// informative only.
func (c *Client) Stats(ctx context.Context) (AgentStats, error) {
	var st AgentStats
	err := c.unary(ctx, OpStats, nil, &st)
	return st, err
}

// rememberCap records the output cap of a background process.
func (c *Client) rememberCap(pid, limit int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.caps) >= maxRememberedCaps {
		for k := range c.caps {
			delete(c.caps, k)
			break
		}
	}
	c.caps[pid] = limit
}

func (c *Client) capOf(pid int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.caps[pid]; ok {
		return n
	}
	return 0
}

// Processes lists the background processes, running or exited.
func (c *Client) Processes(ctx context.Context) ([]api.Process, error) {
	out := []api.Process{}
	err := c.listing(ctx, OpProcesses, nil, func(line []byte) error {
		var p api.Process
		if err := decodeJSON(line, &p); err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// Process describes one process the agent started.
func (c *Client) Process(ctx context.Context, pid int) (api.Process, error) {
	var p api.Process
	err := c.unary(ctx, OpProcess, PidArgs{Pid: pid}, &p)
	return p, err
}

// Signal sends a signal, by name (KILL TERM INT HUP QUIT USR1 USR2 STOP
// CONT), to a process's process group.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	return c.unary(ctx, OpSignal, SignalArgs{Pid: pid, Signal: sig}, nil)
}

// Phase applies the in-sandbox parts of a phase (see PhaseArgs), on an
// agent that announced CapPhase; others fail it with Unsupported.
func (c *Client) Phase(ctx context.Context, args PhaseArgs) (PhaseResult, error) {
	var r PhaseResult
	err := c.unary(ctx, OpPhase, args, &r)
	return r, err
}

// Resize sets the terminal size of a process started with a PTY.
func (c *Client) Resize(ctx context.Context, pid int, rows, cols int) error {
	if rows <= 0 || cols <= 0 || rows > 0xffff || cols > 0xffff {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidSize, "terminal size %dx%d is out of range", rows, cols)
	}
	return c.unary(ctx, OpResize, ResizeArgs{Pid: pid, Rows: uint16(rows), Cols: uint16(cols)}, nil)
}

// CloseStdin closes a background process's standard input (with a PTY it
// sends end-of-file, ^D).
func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	return c.unary(ctx, OpCloseStdin, PidArgs{Pid: pid}, nil)
}

// WriteStdin writes p to a background process's standard input. It
// returns once the agent has written all of p to the process, which may
// wait for the process to read.
func (c *Client) WriteStdin(ctx context.Context, pid int, p []byte) error {
	ctx, cancel := withTimeout(ctx, c.callTimeout)
	defer cancel()
	st, err := c.s.open(ctx, OpStdin, PidArgs{Pid: pid})
	if err != nil {
		return err
	}
	return c.upload(ctx, st, readerOf(p), nil)
}

func readerOf(p []byte) io.Reader {
	return &byteReader{p: p}
}

// byteReader reads a copy of p: the data sent belongs to the session.
type byteReader struct{ p []byte }

func (r *byteReader) Read(b []byte) (int, error) {
	if len(r.p) == 0 {
		return 0, io.EOF
	}
	n := copy(b, r.p)
	r.p = r.p[n:]
	return n, nil
}

// upload sends r on the call's ChanIn until EOF, then waits for the
// reply. If the agent replies early (an error, usually) it stops sending.
func (c *Client) upload(ctx context.Context, st *stream, r io.Reader, result any) error {
	for {
		buf := make([]byte, ChunkSize)
		n, rerr := io.ReadFull(r, buf)
		eof := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !eof {
			st.abandon()
			return rerr
		}
		err := st.sendData(ctx, c.callTimeout, ChanIn, buf[:n], eof)
		if errors.Is(err, errPeerEnded) {
			break
		}
		if err != nil {
			st.abandon()
			return err
		}
		if eof {
			break
		}
	}
	for {
		f, err := st.next(ctx, c.callTimeout)
		if err != nil {
			st.abandon()
			return err
		}
		switch f.Type {
		case FrameReply:
			st.forget()
			return c.decodeReply(f, result)
		case FrameData:
			st.abandon()
			return c.broken("data on an upload")
		}
	}
}

// listing runs a call whose result is NDJSON on ChanOut, one entry a
// line, at most MaxListEntries.
func (c *Client) listing(ctx context.Context, op string, args any, entry func([]byte) error) error {
	return c.listingN(ctx, op, args, MaxListEntries, entry)
}

// listingN is listing with at most limit entries.
func (c *Client) listingN(ctx context.Context, op string, args any, limit int, entry func([]byte) error) error {
	ctx, cancel := withTimeout(ctx, c.callTimeout)
	defer cancel()
	st, err := c.s.open(ctx, op, args)
	if err != nil {
		return err
	}
	var (
		pending []byte
		entries int
	)
	for {
		f, err := st.next(ctx, 0)
		if err != nil {
			st.abandon()
			return err
		}
		switch f.Type {
		case FrameReply:
			st.forget()
			if err := c.decodeReply(f, nil); err != nil {
				return err
			}
			if len(pending) > 0 {
				return c.broken("%s listing ends in a partial line", op)
			}
			return nil
		case FrameData:
			pending = append(pending, f.Payload...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				line := pending[:i]
				pending = pending[i+1:]
				if entries++; entries > limit {
					st.abandon()
					return c.broken("%s listing longer than %d entries", op, limit)
				}
				if err := entry(line); err != nil {
					st.abandon()
					return c.broken("undecodable %s entry: %v", op, err)
				}
			}
			if len(pending) > MaxControlPayload {
				st.abandon()
				return c.broken("%s entry longer than %d bytes", op, MaxControlPayload)
			}
			pending = append([]byte(nil), pending...)
		}
	}
}
