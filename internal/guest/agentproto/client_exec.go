package agentproto

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// ExecRequest is a command for the agent to run: api.ExecRequest with the
// argv already resolved (sandbox.Argv), the user to run as, stdin as a
// stream, and a terminal.
type ExecRequest struct {
	// Argv is the program and its arguments; a program without a slash
	// is looked up in the PATH of the command's environment.
	Argv []string
	// Env is set over the agent's default environment.
	Env map[string]string
	// Cwd is the working directory (default: the agent's workdir).
	Cwd string
	// User is who the command runs as; the zero value is the sandbox's
	// root (0:0).
	User User
	// Stdin is written to the command's standard input, then closed.
	Stdin string
	// StdinReader, if set, is streamed to standard input instead of Stdin
	// until it returns EOF. Exec may return before a blocked Read on it
	// does; the copying goroutine then ends when that Read returns.
	StdinReader io.Reader
	// TimeoutS bounds the run time (default 60 s); the agent kills the
	// command's process group when it runs out.
	TimeoutS float64
	// MaxOutputBytes caps each of stdout and stderr (default 4 MiB).
	MaxOutputBytes int
	// PTY, if set, runs the command on a new pseudo-terminal of that size
	// as its controlling terminal; stdout and stderr are merged into
	// stdout.
	PTY *PTYSize
}

// ExecRequestFrom builds an ExecRequest from a sandbox request and the
// argv sandbox.Argv resolved for it.
func ExecRequestFrom(argv []string, req sandbox.ExecRequest) ExecRequest {
	return ExecRequest{
		Argv:           argv,
		Env:            req.Env,
		Cwd:            req.Cwd,
		Stdin:          req.ExecRequest.Stdin,
		StdinReader:    req.Stdin,
		TimeoutS:       req.TimeoutS,
		MaxOutputBytes: req.MaxOutputBytes,
	}
}

// Output receives a command's output as it is produced. The slices are
// only valid during the call. Callbacks run on the calling goroutine, one
// at a time and in the order the agent sent the data; a slow callback
// slows only its own call.
type Output struct {
	// Stdout and Stderr receive the streams; if both are nil the output
	// is collected into the result instead. A nil callback drops its
	// stream.
	Stdout, Stderr func([]byte)
	// Started, if set, is called with the command's pid once it runs.
	Started func(pid int)
}

func (o Output) streaming() bool { return o.Stdout != nil || o.Stderr != nil }

func (r *ExecRequest) args() (ExecArgs, io.Reader, error) {
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return ExecArgs{}, nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "no command given")
	}
	a := ExecArgs{
		Argv:           r.Argv,
		Env:            r.Env,
		Cwd:            r.Cwd,
		User:           r.User,
		TimeoutS:       r.TimeoutS,
		MaxOutputBytes: r.MaxOutputBytes,
		PTY:            r.PTY,
	}
	if a.MaxOutputBytes <= 0 {
		a.MaxOutputBytes = sandbox.DefaultOutputCap
	}
	stdin := r.StdinReader
	switch {
	case stdin != nil:
		a.StdinStream = true
	case len(r.Stdin) > maxStdinInline:
		stdin, a.StdinStream = strings.NewReader(r.Stdin), true
	default:
		a.Stdin = r.Stdin
	}
	return a, stdin, nil
}

// MaxExecTimeout bounds a command's timeout (and keeps the arithmetic on
// durations from overflowing).
const MaxExecTimeout = 365 * 24 * time.Hour

// ExecTimeout is the timeout of a command whose request says timeoutS:
// DefaultExecTimeout if it is not positive, at most MaxExecTimeout.
func ExecTimeout(timeoutS float64) time.Duration {
	switch {
	case !(timeoutS > 0): // also NaN
		return DefaultExecTimeout
	case timeoutS >= MaxExecTimeout.Seconds():
		return MaxExecTimeout
	}
	return time.Duration(timeoutS * float64(time.Second))
}

// outputSink takes a call's output within its cap, whatever the agent
// sends: into the callbacks, or into captures.
type outputSink struct {
	out              Output
	limit            int
	stdout, stderr   *sandbox.Capture
	seenOut, seenErr int
	truncOut         bool
	truncErr         bool
}

func newOutputSink(out Output, limit int, collect bool) *outputSink {
	if limit <= 0 {
		limit = sandbox.DefaultOutputCap
	}
	s := &outputSink{out: out, limit: limit}
	if collect {
		s.stdout = sandbox.NewCapture(limit, nil, true)
		s.stderr = sandbox.NewCapture(limit, nil, true)
	}
	return s
}

// take handles one Data frame. Past the cap, bytes are dropped.
func (s *outputSink) take(ch Channel, p []byte) {
	seen, trunc, fn, capture := &s.seenOut, &s.truncOut, s.out.Stdout, s.stdout
	if ch == ChanErr {
		seen, trunc, fn, capture = &s.seenErr, &s.truncErr, s.out.Stderr, s.stderr
	}
	if s.limit > 0 {
		room := s.limit - *seen
		if room <= 0 {
			*trunc = *trunc || len(p) > 0
			return
		}
		if len(p) > room {
			p, *trunc = p[:room], true
		}
	}
	*seen += len(p)
	if capture != nil {
		capture.Write(p)
	}
	if fn != nil {
		fn(p)
	}
}

// result completes r with the collected output and truncation flags.
func (s *outputSink) result(r api.ExecResult) api.ExecResult {
	r.Stdout, r.Stderr = "", ""
	if s.stdout != nil {
		r.Stdout, _ = s.stdout.Result()
		r.Stderr, _ = s.stderr.Result()
	}
	r.StdoutTruncated = r.StdoutTruncated || s.truncOut
	r.StderrTruncated = r.StderrTruncated || s.truncErr
	return r
}

// outputCall consumes a call that streams output and ends with an
// api.ExecResult.
func (c *Client) outputCall(ctx context.Context, st *stream, sink *outputSink) (api.ExecResult, error) {
	for {
		f, err := st.next(ctx, 0)
		if err != nil {
			st.abandon()
			return api.ExecResult{}, err
		}
		switch f.Type {
		case FrameData:
			if f.Channel == ChanIn {
				st.abandon()
				return api.ExecResult{}, c.broken("stdin data from the agent")
			}
			sink.take(f.Channel, f.Payload)
		case FrameEvent:
			var ev Started
			if err := decodeJSON(f.Payload, &ev); err != nil {
				st.abandon()
				return api.ExecResult{}, c.broken("undecodable event: %v", err)
			}
			if sink.out.Started != nil && ev.Pid > 0 {
				sink.out.Started(ev.Pid)
			}
		case FrameReply:
			st.forget()
			var res api.ExecResult
			if err := c.decodeReply(f, &res); err != nil {
				return api.ExecResult{}, err
			}
			return sink.result(res), nil
		}
	}
}

// Exec runs a command to completion. With out streaming (a Stdout or
// Stderr callback) the output goes to the callbacks and the result's
// Stdout and Stderr are empty; otherwise it is collected into the result.
// Either way each stream is capped at MaxOutputBytes, past which output
// is dropped and the result marked truncated.
//
// The agent enforces the timeout (TimedOut, exit code -1, Error
// "timeout"); cancelling ctx kills the command. A command that runs and
// fails is a result, not an error; errors are for commands that could
// not run (errdefs.NotFound "command_not_found", …) and for the
// connection.
func (c *Client) Exec(ctx context.Context, req ExecRequest, out Output) (api.ExecResult, error) {
	args, stdin, err := req.args()
	if err != nil {
		return api.ExecResult{}, err
	}
	ctx, cancel := withTimeout(ctx, ExecTimeout(args.TimeoutS)+ExecGrace)
	defer cancel()
	st, err := c.s.open(ctx, OpExec, args)
	if err != nil {
		return api.ExecResult{}, err
	}
	if stdin != nil {
		go c.feed(ctx, st, stdin)
	}
	return c.outputCall(ctx, st, newOutputSink(out, args.MaxOutputBytes, !out.streaming()))
}

// feed streams r to a call's stdin until EOF, the end of the call or of
// ctx.
func (c *Client) feed(ctx context.Context, st *stream, r io.Reader) {
	for {
		buf := make([]byte, ChunkSize)
		n, err := r.Read(buf)
		eof := err != nil // any read error ends the command's input
		if n == 0 && !eof {
			continue
		}
		if st.sendData(ctx, 0, ChanIn, buf[:n], eof) != nil || eof {
			return
		}
	}
}

// Start starts a background process and returns at once. Its output is
// collected by the agent (capped at MaxOutputBytes) for Wait, and can be
// followed with Attach; its stdin stays open for WriteStdin until
// CloseStdin (unless the request gives a Stdin string, which is written
// and closed). A timeout, if set, kills it like Exec's.
func (c *Client) Start(ctx context.Context, req ExecRequest) (api.Process, error) {
	if req.StdinReader != nil {
		return api.Process{}, errdefs.New(errdefs.Invalid, api.CodeInvalidStdin, "a background process takes stdin through WriteStdin, not a reader")
	}
	args, stdin, err := req.args()
	if err != nil {
		return api.Process{}, err
	}
	if stdin != nil {
		return api.Process{}, errdefs.New(errdefs.TooLarge, api.CodeStdinTooLarge, "a background process's stdin string is limited to %d bytes; use WriteStdin", maxStdinInline)
	}
	args.Background = true
	var p api.Process
	if err := c.unary(ctx, OpExec, args, &p); err != nil {
		return api.Process{}, err
	}
	c.rememberCap(p.Pid, args.MaxOutputBytes)
	return p, nil
}

// Wait waits for a background process to exit and returns its result
// with the output the agent collected (capped at the MaxOutputBytes it
// was started with, if it was started through this client, else 4 MiB).
// It waits as long as ctx allows: give it a deadline.
func (c *Client) Wait(ctx context.Context, pid int) (api.ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.s.open(ctx, OpWait, PidArgs{Pid: pid})
	if err != nil {
		return api.ExecResult{}, err
	}
	return c.outputCall(ctx, st, newOutputSink(Output{}, c.capOf(pid), true))
}

// Attach streams a background process's output from now on to out until
// the process exits, then returns its result (without output). Output
// produced faster than out takes it is dropped past a bound on the agent,
// so attaching never slows the process. It waits as long as ctx allows.
func (c *Client) Attach(ctx context.Context, pid int, out Output) (api.ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.s.open(ctx, OpAttach, PidArgs{Pid: pid})
	if err != nil {
		return api.ExecResult{}, err
	}
	sink := newOutputSink(out, -1, false)
	sink.limit = 0 // attach streams without a cap
	return c.outputCall(ctx, st, sink)
}
