package controlplane

import (
	"context"
	"slices"

	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
)

// execDefaults fills in and bounds an exec request.
func (m *Manager) execDefaults(req *api.ExecRequest) error {
	if req.TimeoutS < 0 || req.TimeoutS > m.lim.MaxExecTimeoutS {
		return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "timeout_s must be between 0 and %g", m.lim.MaxExecTimeoutS)
	}
	if req.TimeoutS == 0 {
		req.TimeoutS = m.lim.DefaultExecTimeoutS
	}
	if req.MaxOutputBytes < 0 || req.MaxOutputBytes > m.lim.MaxOutputBytes {
		return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "max_output_bytes must be between 0 and %d", m.lim.MaxOutputBytes)
	}
	if req.MaxOutputBytes == 0 {
		req.MaxOutputBytes = m.lim.DefaultOutputBytes
	}
	if len(req.Env) > maxEnv {
		return errdefs.New(errdefs.Invalid, api.CodeTooManyEnv, "at most %d environment variables", maxEnv)
	}
	for k := range req.Env {
		if !envKey.MatchString(k) {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidEnv, "environment variable %q is not valid", k)
		}
	}
	return nil
}

// Exec runs a command in a running sandbox. With out, output streams to
// it and the result carries none.
func (m *Manager) Exec(ctx context.Context, owner, id string, req api.ExecRequest, out *noderpc.Output) (res api.ExecResult, err error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return res, err
	}
	if err := m.execDefaults(&req); err != nil {
		return res, err
	}
	start := time.Now()
	defer func() { m.obs.Executed(rec.Tier, time.Since(start), err) }()
	r, err := m.recording(ctx, rec)
	if err != nil {
		return res, err
	}
	if r != nil {
		return m.recordedExec(ctx, r, rec, req, out)
	}
	return m.nodes.Exec(ctx, rec.Node, id, req, out)
}

// Process operations route to the sandbox's node; the tier decides
// whether it has processes at all.

func (m *Manager) StartProcess(ctx context.Context, owner, id string, req api.ExecRequest) (api.Process, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.Process{}, err
	}
	if err := m.execDefaults(&req); err != nil {
		return api.Process{}, err
	}
	var p api.Process
	logged, stdinDigest := redactExec(req, rec.SecretEnv)
	st := api.TrajectoryStep{Kind: api.KindExec, Exec: &api.StepExec{Request: logged, StdinDigest: stdinDigest, Process: true}}
	err = m.stepped(ctx, rec, st, func(step int) error {
		if rec.Trajectory != "" {
			if err := m.keepStdin(ctx, rec.Trajectory, req.Stdin, stdinDigest); err != nil {
				return err
			}
		}
		p, err = m.nodes.StartProcess(ctx, rec.Node, id, req)
		st.Exec.Pid = p.Pid
		return err
	})
	if err == nil && p.Pid == 0 {
		// Answered from the log: the replay started it; the newest
		// process that runs the same command is it.
		ps, err := m.nodes.ListProcesses(ctx, rec.Node, id)
		if err != nil {
			return p, err
		}
		for _, q := range ps {
			if slices.Equal(q.Cmd, req.Cmd) || len(req.Cmd) == 0 && len(q.Cmd) > 0 && q.Cmd[len(q.Cmd)-1] == req.Command {
				if q.StartedAt.After(p.StartedAt) {
					p = q
				}
			}
		}
	}
	return p, err
}

func (m *Manager) ListProcesses(ctx context.Context, owner, id string) ([]api.Process, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return nil, err
	}
	return m.nodes.ListProcesses(ctx, rec.Node, id)
}

// Stats reports a running sandbox's resource use, from its node.
func (m *Manager) Stats(ctx context.Context, owner, id string) (api.SandboxStats, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.SandboxStats{}, err
	}
	return m.nodes.Stats(ctx, rec.Node, id)
}

func (m *Manager) GetProcess(ctx context.Context, owner, id string, pid int) (api.Process, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.Process{}, err
	}
	return m.nodes.GetProcess(ctx, rec.Node, id, pid)
}

func (m *Manager) WaitProcess(ctx context.Context, owner, id string, pid int, waitS float64) (api.ExecResult, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.ExecResult{}, err
	}
	if waitS <= 0 || waitS > m.lim.MaxExecTimeoutS {
		waitS = m.lim.DefaultExecTimeoutS
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(waitS*float64(time.Second))+noderpc.DefaultTimeout)
	defer cancel()
	return m.nodes.WaitProcess(ctx, rec.Node, id, pid, waitS)
}

func (m *Manager) SendStdin(ctx context.Context, owner, id string, pid int, data []byte) error {
	rec, err := m.running(owner, id)
	if err != nil {
		return err
	}
	return m.nodes.SendStdin(ctx, rec.Node, id, pid, data)
}

func (m *Manager) CloseStdin(ctx context.Context, owner, id string, pid int) error {
	rec, err := m.running(owner, id)
	if err != nil {
		return err
	}
	return m.nodes.CloseStdin(ctx, rec.Node, id, pid)
}

func (m *Manager) Signal(ctx context.Context, owner, id string, pid int, sig string) error {
	rec, err := m.running(owner, id)
	if err != nil {
		return err
	}
	return m.nodes.Signal(ctx, rec.Node, id, pid, sig)
}
