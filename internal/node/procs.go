package node

import (
	"context"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// setPhase moves a sandbox to another of its phases.
func (a *Service) setPhase(ctx context.Context, req noderpc.SetPhaseRequest) error {
	sb, tier, err := a.lookup(req.ID)
	if err != nil {
		return err
	}
	p, ok := sb.(sandbox.Phaser)
	if !ok {
		return errdefs.New(errdefs.Unsupported, api.CodeTierHasNoPhases, "the %s tier has no phases", tier)
	}
	defer a.ownChange(req.ID)
	err = p.SetPhase(ctx, req.Phase)
	if errdefs.CodeOf(err) != api.CodePhaseChangeFailed {
		return err
	}
	// A phase applied in part would leave the sandbox with some of each
	// phase's permissions: it does not run on (fail closed).
	msg := "; the sandbox was destroyed"
	if derr := a.Destroy(context.WithoutCancel(ctx), req.ID); derr != nil {
		msg = "; destroying the sandbox: " + errdefs.MessageOf(derr)
	}
	return errdefs.Wrap(errdefs.Internal, api.CodePhaseChangeFailed, err, "%s%s", errdefs.MessageOf(err), msg)
}

// stats reports a sandbox's resource use.
func (a *Service) stats(ctx context.Context, t noderpc.Target) (api.SandboxStats, error) {
	sb, _, err := a.lookup(t.ID)
	if err != nil {
		return api.SandboxStats{}, err
	}
	return sb.Stats(ctx)
}

func (a *Service) runner(id string) (sandbox.ProcessRunner, error) {
	sb, tier, err := a.lookup(id)
	if err != nil {
		return nil, err
	}
	rt, err := a.opt.Registry.Lookup(tier)
	if err != nil {
		return nil, err
	}
	pr, ok := sb.(sandbox.ProcessRunner)
	if !ok || !rt.Capabilities().Processes {
		return nil, sandbox.Unsupported(tier, "background processes")
	}
	return pr, nil
}

func (a *Service) process(id string, pid int) (sandbox.Process, error) {
	pr, err := a.runner(id)
	if err != nil {
		return nil, err
	}
	return pr.Process(pid)
}

func (a *Service) procStart(ctx context.Context, r noderpc.ExecRequest) (api.Process, error) {
	pr, err := a.runner(r.ID)
	if err != nil {
		return api.Process{}, err
	}
	a.beginStepAt(r.ID, r.Step)
	p, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: r.Req})
	if err != nil {
		return api.Process{}, err
	}
	return p.Info(), nil
}

func (a *Service) procList(ctx context.Context, r noderpc.ProcRequest) (api.ProcessList, error) {
	pr, err := a.runner(r.ID)
	if err != nil {
		return api.ProcessList{}, err
	}
	return api.ProcessList{Processes: pr.Processes()}, nil
}

func (a *Service) procGet(ctx context.Context, r noderpc.ProcRequest) (api.Process, error) {
	p, err := a.process(r.ID, r.Pid)
	if err != nil {
		return api.Process{}, err
	}
	return p.Info(), nil
}

func (a *Service) procWait(ctx context.Context, r noderpc.ProcRequest) (api.ExecResult, error) {
	p, err := a.process(r.ID, r.Pid)
	if err != nil {
		return api.ExecResult{}, err
	}
	wait := time.Duration(r.WaitS * float64(time.Second))
	if wait <= 0 {
		wait = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return p.Wait(ctx)
}

func (a *Service) procStdin(ctx context.Context, r noderpc.ProcRequest) error {
	p, err := a.process(r.ID, r.Pid)
	if err != nil {
		return err
	}
	return p.WriteStdin(ctx, r.Data)
}

func (a *Service) procCloseStdin(ctx context.Context, r noderpc.ProcRequest) error {
	p, err := a.process(r.ID, r.Pid)
	if err != nil {
		return err
	}
	return p.CloseStdin()
}

func (a *Service) procSignal(ctx context.Context, r noderpc.ProcRequest) error {
	p, err := a.process(r.ID, r.Pid)
	if err != nil {
		return err
	}
	sig := r.Signal
	if sig == "" {
		sig = "KILL"
	}
	return p.Signal(sig)
}
