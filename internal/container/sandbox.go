package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Sandbox is one container sandbox. It is safe for concurrent use.
type Sandbox struct {
	rt          *Runtime
	id          string
	dir         string
	state       *state
	cg          *cgroups.Group
	wait        func() // waits for PID 1 to exit (no-op for adopted ones)
	releaseRoot func() // drops the root's layer references
	// umu guards upper, the writable layer's tmpfs (nil in a sandbox
	// adopted after a node restart: it was detached and the handle went
	// with the old node, and after Destroy); see steps.go.
	umu      sync.Mutex
	upper    *os.Root
	upperDir *os.File          // the same directory, for paths through /proc/self/fd
	lastMark *sandbox.StepMark // the last step's closing mark (steps.go)

	// phaseMu orders phase changes (writers) against reads of the
	// current phase; state is replaced, never changed, under it.
	phaseMu sync.RWMutex
	phases  phaseHistory // when each recent phase began (audit labels)

	agent *agentsandbox.Agent
	// pending is an idle agent's connection before its root is bound
	// (idle.go); nil after, and in every other sandbox.
	pending *pendingRoot

	mu        sync.Mutex // guards following fields
	destroyed bool
	// exit watches the agent (liveness.go); oomBase is the group's own
	// OOM kill count when the watch began.
	exit    *sys.ExitWatch
	oomBase int64
}

var (
	_ sandbox.Sandbox       = (*Sandbox)(nil)
	_ sandbox.ProcessRunner = (*Sandbox)(nil)
)

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// alive fails, with a retryable error, if the agent's connection has
// ended (a sandbox that create hands out must answer its first command).
func (s *Sandbox) alive() error {
	c, err := s.agent.Client()
	if err == nil {
		err = c.Err()
	}
	if err != nil {
		return &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeAgentGone, Cause: err, RetryAfter: time.Second,
			Msg: fmt.Sprintf("the agent of sandbox %s went away while it started; nothing was kept, retry later", s.id)}
	}
	return nil
}

// ping checks the agent answers, within ctx or 5 s.
func (s *Sandbox) ping(ctx context.Context) error {
	c, err := s.agent.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Hello(ctx)
	return err
}

// Exec implements sandbox.Sandbox.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	cmd, err := s.command(&req)
	if err != nil {
		return api.ExecResult{}, err
	}
	phase := s.Phase()
	res, err := s.agent.Exec(ctx, cmd, req.Stdout, req.Stderr, nil)
	res.Phase = phase
	if err == nil && (res.StdoutTruncated || res.StderrTruncated) {
		s.record(monitor.Event{Kind: monitor.KindOutputCapped, Path: cmd.Argv[0]})
	}
	return res, err
}

// command is req for the agent, with the sandbox's variables (the agent's
// own environment is every sandbox's: BaseEnv), run as the current
// phase's user with its capabilities. It fails first if the agent is
// gone.
func (s *Sandbox) command(req *sandbox.ExecRequest) (agentproto.ExecRequest, error) {
	if _, err := s.agent.Client(); err != nil {
		return agentproto.ExecRequest{}, err
	}
	cmd, err := s.agent.Command(req, s.state.Spec, s.commandPhase())
	if err != nil {
		return agentproto.ExecRequest{}, err
	}
	cmd.Env = agentsandbox.CommandEnv(s.state.Spec, req.Env)
	return cmd, nil
}

// StartProcess implements sandbox.ProcessRunner.
func (s *Sandbox) StartProcess(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	cmd, err := s.command(&req)
	if err != nil {
		return nil, err
	}
	return s.agent.Start(ctx, cmd)
}

// Processes implements sandbox.ProcessRunner.
func (s *Sandbox) Processes() []api.Process { return s.agent.Processes() }

// Process implements sandbox.ProcessRunner.
func (s *Sandbox) Process(pid int) (sandbox.Process, error) { return s.agent.Process(pid) }

// Stats implements sandbox.Sandbox, from the host's view of the sandbox
// (its cgroups and upper tmpfs), never from the agent.
func (s *Sandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	st, err := s.cg.Stats()
	if err != nil {
		return sandbox.Stats{}, err
	}
	// The root is in no host mount table; its first process's root link
	// reaches it (statfs of an overlay is its upper's). That process is
	// checked to be in the sandbox's cgroup: the pid is not another's.
	disk, err := sys.StatFS(fmt.Sprintf("/proc/%d/root/", s.state.Pid))
	if err == nil {
		var procs []int
		if procs, err = s.cg.Procs(); err == nil && !slices.Contains(procs, s.state.Pid) {
			err = errors.New("its first process is gone")
		}
	}
	if err != nil {
		return sandbox.Stats{}, err
	}
	spec := s.state.Spec
	lim := s.rt.limits(spec)
	if p := s.commandPhase(); p != nil {
		lim = s.rt.phaseLimits(spec, *p)
	}
	return sandbox.Stats{
		MemoryBytes: st.MemoryBytes, MemoryPeakBytes: st.MemoryPeak, MemoryLimitBytes: lim.MemoryBytes,
		CPUSeconds: st.CPUSeconds, Processes: int(st.Pids), PidsLimited: st.PidsLimited, OOMKills: st.OOMKills,
		DiskBytes: disk.Used, DiskLimitBytes: disk.Size, DiskFull: disk.Full(),
	}, nil
}

// Destroy implements sandbox.Sandbox: every process of the sandbox is
// killed through its cgroup (the agent is not asked), then its root, upper,
// network and cgroups go.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return nil
	}
	s.destroyed = true
	s.mu.Unlock()
	s.agent.Close()
	if s.pending != nil {
		s.pending.close()
	}
	s.closeExitWatch()
	ctx = context.WithoutCancel(ctx)
	var errs []error
	s.survivors()
	if err := s.cg.Kill(ctx); errors.Is(err, context.DeadlineExceeded) {
		// A task that cannot die yet (in uninterruptible sleep: a hung
		// file system, a loaded host) holds the sandbox's namespaces and
		// mounts, so nothing can be released: the sandbox stays, thawed
		// and dead to its client, for a later Destroy (the control plane
		// retries) to finish.
		s.mu.Lock()
		s.destroyed = false
		s.mu.Unlock()
		e := errdefs.Wrap(errdefs.Unavailable, api.CodeDestroyIncomplete, err, "sandbox %s: not every process could be killed yet; destroying it again will finish", s.id)
		e.RetryAfter = 5 * time.Second
		return e
	} else if err != nil {
		errs = append(errs, err)
	}
	// The root and its upper went with the last process (their only
	// mounts were in its namespace).
	s.wait()
	s.releaseRoot()
	s.closeUpper()
	// Its user namespace went with its last process.
	s.rt.owners.release(s.state.Owner)
	if err := s.rt.opt.Network.Release(ctx, s.id); err != nil {
		errs = append(errs, err)
	}
	if m := s.rt.opt.Monitor; m != nil && s.cg.ID() != 0 {
		m.Unwatch(s.cg.ID())
	}
	if g := s.rt.opt.Exec; g != nil && s.cg.ID() != 0 {
		if err := g.UnrestrictExec(s.cg.ID()); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.rt.opt.Cgroups.Recycle(ctx, s.cg); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	s.rt.forget(s)
	if err := errors.Join(errs...); err != nil {
		return errdefs.Wrap(errdefs.Internal, api.CodeDestroyFailed, err, "sandbox %s was not fully removed", s.id)
	}
	return nil
}

// detach drops the node's connection and leaves the sandbox running (the
// runtime is closing; a later Recover adopts it again).
func (s *Sandbox) detach() {
	s.agent.Close()
	s.closeExitWatch()
}
