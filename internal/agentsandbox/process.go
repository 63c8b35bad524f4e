package agentsandbox

import (
	"context"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Process is sandbox.Process for a background process the agent runs,
// addressed by pid through the agent.
type Process struct {
	agent *Agent
	pid   int
}

var _ sandbox.Process = Process{}

// Info implements sandbox.Process: a process the agent cannot tell of
// (gone, or the agent unreachable) is exited.
func (p Process) Info() api.Process {
	c, err := p.agent.Client()
	if err != nil {
		return api.Process{Pid: p.pid, State: api.ProcessExited}
	}
	info, err := c.Process(context.Background(), p.pid)
	if err != nil {
		return api.Process{Pid: p.pid, State: api.ProcessExited}
	}
	return info
}

// Wait implements sandbox.Process.
func (p Process) Wait(ctx context.Context) (api.ExecResult, error) {
	c, err := p.agent.Client()
	if err != nil {
		return api.ExecResult{}, err
	}
	return c.Wait(ctx, p.pid)
}

// WriteStdin implements sandbox.Process.
func (p Process) WriteStdin(ctx context.Context, b []byte) error {
	c, err := p.agent.Client()
	if err != nil {
		return err
	}
	return c.WriteStdin(ctx, p.pid, b)
}

// CloseStdin implements sandbox.Process.
func (p Process) CloseStdin() error {
	c, err := p.agent.Client()
	if err != nil {
		return err
	}
	return c.CloseStdin(context.Background(), p.pid)
}

// Signal implements sandbox.Process.
func (p Process) Signal(sig string) error {
	c, err := p.agent.Client()
	if err != nil {
		return err
	}
	return c.Signal(context.Background(), p.pid, sig)
}

// Resize sets the process's terminal size (a process started with a
// PTY).
func (p Process) Resize(ctx context.Context, rows, cols int) error {
	c, err := p.agent.Client()
	if err != nil {
		return err
	}
	return c.Resize(ctx, p.pid, rows, cols)
}
