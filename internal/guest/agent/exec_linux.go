package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// eot is what closing stdin means on a terminal: ^D.
var eot = []byte{4}

// exec runs a command: to completion, streaming its output to the call,
// or in the background.
func (a *agent) exec(c *agentproto.Call, args agentproto.ExecArgs) {
	if args.MaxOutputBytes <= 0 {
		args.MaxOutputBytes = a.opt.MaxOutput
	}
	if args.Background {
		a.startBackground(c, &args)
		return
	}
	p, pio, err := a.spawn(&args, false)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	defer a.forget(p)
	c.Event(agentproto.Started{Pid: p.pid}) // fails only if the call is gone

	fctx, fcancel := context.WithCancel(c.Context())
	defer fcancel()
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		feed(fctx, c, &args, pio.stdin)
	}()

	var (
		pumps sync.WaitGroup
		trunc [3]bool
		dr    drain
	)
	pump := func(ch agentproto.Channel, f *os.File) {
		defer pumps.Done()
		sent := 0
		var sendErr error
		dr.readOutput(f, func(b []byte) bool {
			room := args.MaxOutputBytes - sent
			if room <= 0 {
				trunc[ch] = true
				return false // never kill for flooding: drop and read on
			}
			if len(b) > room {
				b, trunc[ch] = b[:room], true
			}
			sent += len(b)
			if sendErr != nil {
				return false // the node is gone; keep draining
			}
			sendErr = c.Send(ch, b)
			return true
		})
	}
	pumps.Add(1)
	go pump(agentproto.ChanOut, pio.stdout)
	if pio.stderr != nil {
		pumps.Add(1)
		go pump(agentproto.ChanErr, pio.stderr)
	}

	timer := time.NewTimer(agentproto.ExecTimeout(args.TimeoutS))
	defer timer.Stop()
	var timedOut, cancelled bool
	select {
	case <-p.exited:
	case <-timer.C:
		timedOut = true
	case <-c.Context().Done():
		cancelled = true
	}
	if timedOut || cancelled {
		theReaper.signalGroup(p, syscall.SIGKILL)
		<-p.exited
	}
	a.finishIO(p, pio, &pumps, &dr, fcancel, fed)
	res := endResult(p, timedOut, cancelled)
	res.StdoutTruncated, res.StderrTruncated = trunc[agentproto.ChanOut], trunc[agentproto.ChanErr]
	c.Reply(res, nil)
}

// finishIO ends a command's I/O once it has exited: its output is read
// on until drainGrace passes with nothing to read, or drainCap in all
// (so `cmd &` does not hold the call open), then the stdin feeder is
// stopped and everything closed.
func (a *agent) finishIO(p *proc, pio stdio, pumps *sync.WaitGroup, dr *drain, stopFeed func(), fed <-chan struct{}) {
	dr.start()
	grace := time.Now().Add(drainGrace)
	pio.stdout.SetReadDeadline(grace)
	if pio.stderr != nil {
		pio.stderr.SetReadDeadline(grace)
	}
	pumps.Wait()
	stopFeed()
	if pio.stdin != nil {
		pio.stdin.SetWriteDeadline(time.Now())
	}
	<-fed
	pio.closeOutputs()
	if pio.stdin != nil {
		pio.stdin.Close()
	}
}

// feed writes a command's stdin, from the request's string or the call's
// stream, then closes it (sends ^D to a terminal).
func feed(ctx context.Context, c *agentproto.Call, args *agentproto.ExecArgs, w *os.File) {
	if w == nil {
		return
	}
	switch {
	case args.StdinStream:
		for {
			b, err := c.Recv(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
			if _, err := w.Write(b); err != nil {
				return // the command stopped reading; the rest is dropped
			}
		}
	case args.Stdin != "":
		if _, err := w.Write([]byte(args.Stdin)); err != nil {
			return
		}
	default:
		return
	}
	if args.PTY != nil {
		w.Write(eot)
		return
	}
	w.Close()
}

// startBackground starts a background process and replies with it; its
// output goes to captures for Wait and to attached calls.
func (a *agent) startBackground(c *agentproto.Call, args *agentproto.ExecArgs) {
	p, pio, err := a.spawn(args, true)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	var timeout time.Duration
	if args.TimeoutS > 0 {
		timeout = agentproto.ExecTimeout(args.TimeoutS)
	}
	go a.supervise(p, pio, *args, timeout)
	c.Event(agentproto.Started{Pid: p.pid})
	c.Reply(p.info(), nil)
}

// supervise runs a background process's I/O until it exits (or its
// timeout kills it), then records its result.
func (a *agent) supervise(p *proc, pio stdio, args agentproto.ExecArgs, timeout time.Duration) {
	var (
		pumps sync.WaitGroup
		dr    drain
	)
	pump := func(ch agentproto.Channel, f *os.File, capture *sandbox.Capture) {
		defer pumps.Done()
		dr.readOutput(f, func(b []byte) bool {
			capture.Write(b)
			p.publish(ch, b)
			return false
		})
	}
	pumps.Add(1)
	go pump(agentproto.ChanOut, pio.stdout, p.stdout)
	if pio.stderr != nil {
		pumps.Add(1)
		go pump(agentproto.ChanErr, pio.stderr, p.stderr)
	}
	fed := make(chan struct{})
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	go func() {
		defer close(fed)
		if args.Stdin == "" {
			return
		}
		if err := p.writeStdin(fctx, []byte(args.Stdin)); err == nil {
			p.closeStdin(fctx)
		}
	}()
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	timedOut := false
	select {
	case <-p.exited:
	case <-timer:
		timedOut = true
		theReaper.signalGroup(p, syscall.SIGKILL)
		<-p.exited
	}
	p.stdinShut.Store(true) // finishIO closes it: pio.stdin is p.stdin
	a.finishIO(p, pio, &pumps, &dr, fcancel, fed)
	res := endResult(p, timedOut, false)
	_, res.StdoutTruncated = p.stdout.Result()
	_, res.StderrTruncated = p.stderr.Result()
	p.result = res
	close(p.done)
	a.evictExited()
}

// evictExited forgets the oldest exited background processes past
// maxKeptExited.
func (a *agent) evictExited() {
	a.mu.Lock()
	defer a.mu.Unlock()
	var exited []*proc
	for _, p := range a.procs {
		if p.background && isClosed(p.done) {
			exited = append(exited, p)
		}
	}
	if len(exited) <= maxKeptExited {
		return
	}
	slices.SortFunc(exited, func(x, y *proc) int { return x.endedAt.Compare(y.endedAt) })
	for _, p := range exited[:len(exited)-maxKeptExited] {
		delete(a.procs, p.pid)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// writeStdin writes b to a background process's stdin; ctx interrupts a
// write the process does not read.
func (p *proc) writeStdin(ctx context.Context, b []byte) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	w := p.stdin
	if w == nil || p.stdinShut.Load() {
		return errdefs.New(errdefs.Conflict, api.CodeStdinClosed, "the standard input of process %d is closed", p.pid)
	}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
			w.SetWriteDeadline(time.Now())
		case <-stop:
		}
	}()
	_, err := w.Write(b)
	close(stop)
	<-stopped
	w.SetWriteDeadline(time.Time{})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) || p.stdinShut.Load():
		return errdefs.Wrap(errdefs.Conflict, api.CodeStdinClosed, err, "the standard input of process %d is closed", p.pid)
	case ctx.Err() != nil:
		return errdefs.Wrap(errdefs.DeadlineExceeded, api.CodeStdinTimeout, err, "process %d did not read its standard input", p.pid)
	}
	return errdefs.Wrap(errdefs.Internal, api.CodeStdinFailed, err, "writing to process %d", p.pid)
}

// closeStdin closes a background process's stdin (a write in progress
// fails); on a terminal it sends ^D instead, which ctx bounds. It is
// idempotent.
func (p *proc) closeStdin(ctx context.Context) error {
	if p.pty != nil {
		return p.writeStdin(ctx, eot)
	}
	p.shutStdin()
	return nil
}

// shutStdin closes the stdin file once.
func (p *proc) shutStdin() {
	if p.stdin != nil && p.stdinShut.CompareAndSwap(false, true) {
		p.stdin.Close()
	}
}

// subscriber is an attached call's bounded buffer of a process's output.
type subscriber struct {
	wake chan struct{}

	mu      sync.Mutex // guards following fields
	chunks  []chunk
	bytes   int
	dropped int64
}

type chunk struct {
	ch   agentproto.Channel
	data []byte
}

// publish copies b to every attached call, dropping what a slow one has
// no room for: attaching never slows the process.
func (p *proc) publish(ch agentproto.Channel, b []byte) {
	p.subsMu.Lock()
	defer p.subsMu.Unlock()
	for s := range p.subs {
		s.mu.Lock()
		if s.bytes+len(b) > attachBuffer {
			s.dropped += int64(len(b))
		} else {
			s.chunks = append(s.chunks, chunk{ch: ch, data: slices.Clone(b)})
			s.bytes += len(b)
		}
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (p *proc) subscribe() *subscriber {
	s := &subscriber{wake: make(chan struct{}, 1)}
	p.subsMu.Lock()
	p.subs[s] = struct{}{}
	p.subsMu.Unlock()
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.subsMu.Lock()
	delete(p.subs, s)
	p.subsMu.Unlock()
}

func (s *subscriber) take() []chunk {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.chunks
	s.chunks, s.bytes = nil, 0
	return out
}

func (a *agent) attach(c *agentproto.Call, args agentproto.PidArgs) {
	p, err := a.lookup(args.Pid, true)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	s := p.subscribe()
	defer p.unsubscribe(s)
	for {
		for _, ch := range s.take() {
			if err := c.Send(ch.ch, ch.data); err != nil {
				c.Reply(nil, err)
				return
			}
		}
		select {
		case <-s.wake:
			continue
		case <-p.done:
		case <-c.Context().Done():
			c.Reply(nil, errdefs.New(errdefs.Unavailable, api.CodeCanceled, "attach cancelled"))
			return
		}
		// The pumps have ended: what is buffered is all there is.
		for _, ch := range s.take() {
			if err := c.Send(ch.ch, ch.data); err != nil {
				c.Reply(nil, err)
				return
			}
		}
		res := p.result
		if s.dropped > 0 {
			a.logger.Debug("attach dropped output", "pid", p.pid, "bytes", s.dropped)
		}
		c.Reply(res, nil)
		return
	}
}

func (a *agent) wait(c *agentproto.Call, args agentproto.PidArgs) {
	p, err := a.lookup(args.Pid, true)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	select {
	case <-p.done:
	case <-c.Context().Done():
		c.Reply(nil, errdefs.New(errdefs.Unavailable, api.CodeCanceled, "wait cancelled"))
		return
	}
	out, _ := p.stdout.Result()
	errs, _ := p.stderr.Result()
	if err := c.Send(agentproto.ChanOut, []byte(out)); err != nil {
		c.Reply(nil, err)
		return
	}
	if err := c.Send(agentproto.ChanErr, []byte(errs)); err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(p.result, nil)
}

func (a *agent) writeStdin(c *agentproto.Call, args agentproto.PidArgs) {
	p, err := a.lookup(args.Pid, true)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	for {
		b, err := c.Recv(c.Context())
		if err == io.EOF {
			c.Reply(struct{}{}, nil)
			return
		}
		if err == nil {
			err = p.writeStdin(c.Context(), b)
		}
		if err != nil {
			c.Reply(nil, err)
			return
		}
	}
}

func (a *agent) closeStdin(c *agentproto.Call, args agentproto.PidArgs) {
	p, err := a.lookup(args.Pid, true)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(struct{}{}, p.closeStdin(c.Context()))
}

// signals are the signals the API can send, by name.
var signals = map[string]syscall.Signal{
	"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "INT": syscall.SIGINT,
	"HUP": syscall.SIGHUP, "QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT,
	"WINCH": syscall.SIGWINCH, "ALRM": syscall.SIGALRM,
}

func signalName(s syscall.Signal) string {
	for name, sig := range signals {
		if sig == s {
			return name
		}
	}
	return s.String()
}

func (a *agent) signal(c *agentproto.Call, args agentproto.SignalArgs) {
	name := strings.TrimPrefix(strings.ToUpper(args.Signal), "SIG")
	if name == "" {
		name = "KILL"
	}
	sig, ok := signals[name]
	if !ok {
		c.Reply(nil, errdefs.New(errdefs.Invalid, api.CodeInvalidSignal, "unknown signal %q", args.Signal))
		return
	}
	p, err := a.lookup(args.Pid, false)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	if err := theReaper.signalGroup(p, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			c.Reply(nil, errdefs.New(errdefs.Conflict, api.CodeProcessExited, "process %d has exited", p.pid))
			return
		}
		c.Reply(nil, errdefs.Wrap(errdefs.Internal, api.CodeSignalFailed, err, "signalling process %d", p.pid))
		return
	}
	c.Reply(struct{}{}, nil)
}

func (a *agent) resize(c *agentproto.Call, args agentproto.ResizeArgs) {
	if args.Rows == 0 || args.Cols == 0 {
		c.Reply(nil, errdefs.New(errdefs.Invalid, api.CodeInvalidSize, "terminal size %dx%d", args.Rows, args.Cols))
		return
	}
	p, err := a.lookup(args.Pid, false)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	if p.pty == nil {
		c.Reply(nil, errdefs.New(errdefs.Invalid, api.CodeNoPty, "process %d has no terminal", p.pid))
		return
	}
	if err := sys.SetWinsize(p.pty, args.Rows, args.Cols); err != nil {
		if p.hasExited() {
			err = errdefs.Wrap(errdefs.Conflict, api.CodeProcessExited, err, "process %d has exited", p.pid)
		}
		c.Reply(nil, err)
		return
	}
	c.Reply(struct{}{}, nil)
}

func (a *agent) processes(c *agentproto.Call) {
	a.mu.Lock()
	var list []*proc
	for _, p := range a.procs {
		if p.background {
			list = append(list, p)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(list, func(x, y *proc) int {
		if c := x.startedAt.Compare(y.startedAt); c != 0 {
			return c
		}
		return x.pid - y.pid
	})
	infos := make([]api.Process, len(list))
	for i, p := range list {
		infos[i] = p.info()
	}
	if err := sendLines(c, infos); err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(struct{}{}, nil)
}

func (a *agent) process(c *agentproto.Call, args agentproto.PidArgs) {
	p, err := a.lookup(args.Pid, false)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(p.info(), nil)
}
