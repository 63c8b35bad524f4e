package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// maxConns bounds the node's concurrent connections (a restarted node
// agent reconnects while the old connection may linger).
const maxConns = 16

// shielded are the signals a process in the sandbox could send to PID 1
// that Go would otherwise act on (exit, dump, crash). Sent by kill(2), a
// notified signal is only queued to a channel; real faults still crash.
var shielded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP,
	syscall.SIGABRT, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGPIPE,
	syscall.SIGTERM, syscall.SIGSTKFLT, syscall.SIGSYS, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGALRM, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGPWR,
}

// agent is one Run: its options, file root and processes.
type agent struct {
	opt     Options
	logger  *slog.Logger
	root    *os.Root
	cgroup  *os.File // Options.CommandCgroup, open; nil without
	workdir string
	started time.Time
	conns   atomic.Int32

	phaseMu sync.Mutex // guards writable; orders phase changes (OpPhase)
	// writable are the last phase's writable paths, bound writable
	// (nil: the whole root is).
	writable []string

	// state is the writable layer, for snapshots (nil without
	// Options.Upper).
	state *upperState

	mu    sync.Mutex    // guards following fields
	procs map[int]*proc // processes started by this agent and not forgotten
}

// Run serves the node on opt.Listener until ctx is done or the listener
// fails, then kills every process it started and returns. It must run in
// the sandbox's namespaces, as PID 1 (or with Options.Subreaper): it reaps
// every child of the process, so nothing else in the process may wait for
// children while it runs.
//
// On start it marks every inherited descriptor above 2 close-on-exec and
// clears the process's dumpable flag; as PID 1 (or Subreaper) it also sets
// GOMAXPROCS to 1 and ignores the signals sandbox processes could send it
// (stop it by cancelling ctx or, from the host, with SIGKILL).
func Run(ctx context.Context, opt Options) error {
	if err := opt.withDefaults(); err != nil {
		return err
	}
	defer opt.Listener.Close()
	root, err := os.OpenRoot(opt.Root)
	if err != nil {
		return errdefs.Wrap(errdefs.Invalid, api.CodeBadRoot, err, "opening the file root %s", opt.Root)
	}
	defer root.Close()
	a := &agent{
		opt:     opt,
		logger:  opt.Logger,
		root:    root,
		workdir: opt.Workdir,
		started: time.Now(),
		procs:   map[int]*proc{},
	}
	if opt.CommandCgroup != "" {
		f, err := os.OpenFile(opt.CommandCgroup, os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			return errdefs.Wrap(errdefs.Invalid, api.CodeBadCgroup, err, "opening the commands' cgroup %s", opt.CommandCgroup)
		}
		defer f.Close()
		a.cgroup = f
	}
	if opt.Upper != nil {
		st, err := openUpper(opt.Upper)
		if err != nil {
			return err
		}
		defer st.close()
		a.state = st
	}
	if a.workdir == "" {
		a.workdir = "/"
		if fi, err := os.Stat(sandbox.Workdir); err == nil && fi.IsDir() {
			a.workdir = sandbox.Workdir
		}
	}
	if err := sys.CloexecFrom(3); err != nil {
		a.logger.Warn("inherited descriptors may reach commands", "err", err)
	}
	if err := sys.SetNotDumpable(); err != nil {
		a.logger.Warn("the agent stays dumpable", "err", err)
	}
	initMode := os.Getpid() == 1 || opt.Subreaper
	if initMode {
		// One P: the agent waits on I/O and children; each extra P costs
		// resident memory (~250 KiB measured) in every sandbox.
		runtime.GOMAXPROCS(1)
		if os.Getpid() != 1 {
			if err := sys.SetChildSubreaper(); err != nil {
				return err
			}
		}
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, shielded...)
		go func() {
			for s := range sigs {
				a.logger.Debug("ignoring a signal", "signal", s)
			}
		}()
		defer func() {
			signal.Stop(sigs) // no more sends to sigs once it returns
			close(sigs)
		}()
	}
	theReaper.acquire(initMode)
	defer theReaper.release()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		opt.Listener.Close()
	}()
	var wg sync.WaitGroup
	err = a.accept(ctx, &wg)
	cancel()
	wg.Wait()
	a.killAll()
	if ctx.Err() != nil && errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// accept serves connections until the listener fails.
func (a *agent) accept(ctx context.Context, wg *sync.WaitGroup) error {
	var delay time.Duration
	for {
		conn, err := a.opt.Listener.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return net.ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				a.logger.Warn("accept failed; retrying", "err", err, "delay", delay)
				select {
				case <-time.After(delay):
				case <-ctx.Done():
				}
				continue
			}
			return err
		}
		delay = 0
		if err := a.admit(conn); err != nil {
			a.logger.Warn("refusing a connection", "err", err)
			conn.Close()
			continue
		}
		wg.Add(1)
		a.conns.Add(1)
		go func() {
			defer wg.Done()
			defer a.conns.Add(-1)
			if err := agentproto.Serve(ctx, conn, a.logger, a.handle); err != nil && ctx.Err() == nil {
				a.logger.Info("connection ended", "err", err)
			}
		}()
	}
}

// admit checks a new connection's peer.
func (a *agent) admit(conn net.Conn) error {
	if a.conns.Load() >= maxConns {
		return errdefs.New(errdefs.RateLimited, api.CodeTooManyConnections, "%d connections already", maxConns)
	}
	if pc, ok := conn.(PeerConn); ok {
		cred, err := pc.PeerCred()
		if err != nil {
			return err
		}
		return a.opt.PeerCheck(cred)
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return errdefs.New(errdefs.PermissionDenied, api.CodePeerUnknown, "a %T has no peer credentials", conn)
	}
	cred, err := sys.PeerCred(sc)
	if err != nil {
		return err
	}
	return a.opt.PeerCheck(cred)
}

// handle serves one call.
func (a *agent) handle(c *agentproto.Call) {
	switch c.Op {
	case agentproto.OpHello:
		serve(c, a.hello)
	case agentproto.OpExec:
		serve(c, a.exec)
	case agentproto.OpWait:
		serve(c, a.wait)
	case agentproto.OpAttach:
		serve(c, a.attach)
	case agentproto.OpStdin:
		serve(c, a.writeStdin)
	case agentproto.OpCloseStdin:
		serve(c, a.closeStdin)
	case agentproto.OpSignal:
		serve(c, a.signal)
	case agentproto.OpResize:
		serve(c, a.resize)
	case agentproto.OpProcesses:
		a.processes(c)
	case agentproto.OpProcess:
		serve(c, a.process)
	case agentproto.OpOpen:
		serve(c, a.open)
	case agentproto.OpWrite:
		serve(c, a.write)
	case agentproto.OpList:
		serve(c, a.list)
	case agentproto.OpStat:
		serve(c, a.stat)
	case agentproto.OpMkdir:
		serve(c, a.mkdir)
	case agentproto.OpRemove:
		serve(c, a.remove)
	case agentproto.OpRename:
		serve(c, a.rename)
	case agentproto.OpStats:
		c.Reply(a.stats(), nil)
	case agentproto.OpPhase:
		a.phase(c)
	case agentproto.OpFreeze:
		a.withState(c, func(st *upperState) { serve(c, st.freeze) })
	case agentproto.OpThaw:
		a.withState(c, func(st *upperState) { c.Reply(struct{}{}, st.thaw()) })
	case agentproto.OpStateList:
		a.withState(c, func(st *upperState) { st.list(c) })
	case agentproto.OpStateRead:
		a.withState(c, func(st *upperState) { serve(c, st.read) })
	default:
		c.Reply(nil, errdefs.New(errdefs.Unsupported, api.CodeUnknownOp, "the agent has no %q operation", c.Op))
	}
}

// serve decodes c's arguments into an A and passes them to h, the
// call's handler; undecodable arguments are the call's reply (Invalid,
// bad_request) and h does not run.
func serve[A any](c *agentproto.Call, h func(*agentproto.Call, A)) {
	var args A
	if err := c.Decode(&args); err != nil {
		c.Reply(nil, err)
		return
	}
	h(c, args)
}

func (a *agent) hello(c *agentproto.Call, args agentproto.HelloArgs) {
	// The agent answers with its own version whatever the node speaks;
	// the node decides whether it can talk to it.
	caps := []string{
		agentproto.CapExec, agentproto.CapProcesses, agentproto.CapPTY,
		agentproto.CapAttach, agentproto.CapFiles, agentproto.CapStats,
	}
	if a.opt.Phases {
		caps = append(caps, agentproto.CapPhase)
	}
	if a.state != nil {
		caps = append(caps, agentproto.CapState)
	}
	c.Reply(agentproto.Hello{
		Protocol:     agentproto.Protocol,
		AgentVersion: a.opt.Version,
		Pid:          os.Getpid(),
		Capabilities: caps,
	}, nil)
}
