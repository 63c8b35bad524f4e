package agentproto

import (
	"context"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Process is sandbox.Process for a background process an agent runs
// (container and microvm tiers), addressed by pid through the agent.
type Process struct {
	// Agent returns the sandbox's connection to its agent.
	Agent func() (*Client, error)
	Pid   int
}

var _ sandbox.Process = Process{}

// StartProcess starts req in the background on the agent; the process
// is a Process.
func StartProcess(ctx context.Context, agent func() (*Client, error), req ExecRequest) (sandbox.Process, error) {
	c, err := agent()
	if err != nil {
		return nil, err
	}
	p, err := c.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return Process{Agent: agent, Pid: p.Pid}, nil
}

// ListProcesses lists the agent's background processes (none if it
// cannot be reached).
func ListProcesses(agent func() (*Client, error)) []api.Process {
	c, err := agent()
	if err != nil {
		return nil
	}
	ps, _ := c.Processes(context.Background())
	return ps
}

// LookupProcess returns the agent's process pid (a Process), or its
// error (NotFound for an unknown pid).
func LookupProcess(agent func() (*Client, error), pid int) (sandbox.Process, error) {
	c, err := agent()
	if err != nil {
		return nil, err
	}
	if _, err := c.Process(context.Background(), pid); err != nil {
		return nil, err
	}
	return Process{Agent: agent, Pid: pid}, nil
}

func (p Process) Info() api.Process {
	c, err := p.Agent()
	if err != nil {
		return api.Process{Pid: p.Pid, State: api.ProcessExited}
	}
	info, err := c.Process(context.Background(), p.Pid)
	if err != nil {
		return api.Process{Pid: p.Pid, State: api.ProcessExited}
	}
	return info
}

func (p Process) Wait(ctx context.Context) (api.ExecResult, error) {
	c, err := p.Agent()
	if err != nil {
		return api.ExecResult{}, err
	}
	return c.Wait(ctx, p.Pid)
}

func (p Process) WriteStdin(ctx context.Context, b []byte) error {
	c, err := p.Agent()
	if err != nil {
		return err
	}
	return c.WriteStdin(ctx, p.Pid, b)
}

func (p Process) CloseStdin() error {
	c, err := p.Agent()
	if err != nil {
		return err
	}
	return c.CloseStdin(context.Background(), p.Pid)
}

func (p Process) Signal(sig string) error {
	c, err := p.Agent()
	if err != nil {
		return err
	}
	return c.Signal(context.Background(), p.Pid, sig)
}

// Resize sets the process's terminal size (a process started with a
// PTY).
func (p Process) Resize(ctx context.Context, rows, cols int) error {
	c, err := p.Agent()
	if err != nil {
		return err
	}
	return c.Resize(ctx, p.Pid, rows, cols)
}

// CommandUser is who the commands of phase p (nil: no phases) of spec
// run as, with which capabilities: the phase's user, and the phase's
// capabilities (the sandbox's without phases).
func CommandUser(spec sandbox.Spec, p *api.Phase) User {
	var u User
	if p != nil {
		u.UID, u.GID, _ = sandbox.ParseUser(p.User) // checked at create
	}
	for _, n := range sandbox.CommandCapabilities(spec, p) {
		if c, ok := sandbox.CapabilityNumber(n); ok {
			u.Caps = append(u.Caps, uint(c))
		}
	}
	return u
}
