package noderpc

import (
	"context"

	"github.com/dsec-dev/dsec/api"
)

// StartProcess starts a background process (of the step WithStep put in
// ctx, if any).
func (c *Client) StartProcess(ctx context.Context, node, id string, req api.ExecRequest) (api.Process, error) {
	var p api.Process
	err := c.request(ctx, node, OpProcStart, ExecRequest{ID: id, Req: req, Step: StepOf(ctx)}, &p)
	return p, err
}

// ListProcesses lists a sandbox's background processes.
func (c *Client) ListProcesses(ctx context.Context, node, id string) ([]api.Process, error) {
	var l api.ProcessList
	err := c.request(ctx, node, OpProcList, ProcRequest{ID: id}, &l)
	return l.Processes, err
}

// SetPhase moves a sandbox to another of its phases.
func (c *Client) SetPhase(ctx context.Context, node, id string, p api.Phase) error {
	return c.request(ctx, node, OpSetPhase, SetPhaseRequest{ID: id, Phase: p}, nil)
}

// Stats reports a sandbox's resource use.
func (c *Client) Stats(ctx context.Context, node, id string) (api.SandboxStats, error) {
	var st api.SandboxStats
	err := c.request(ctx, node, OpStats, Target{ID: id}, &st)
	return st, err
}

// GetProcess describes one background process.
func (c *Client) GetProcess(ctx context.Context, node, id string, pid int) (api.Process, error) {
	var p api.Process
	err := c.request(ctx, node, OpProcGet, ProcRequest{ID: id, Pid: pid}, &p)
	return p, err
}

// WaitProcess waits up to waitS seconds for a process to exit.
func (c *Client) WaitProcess(ctx context.Context, node, id string, pid int, waitS float64) (api.ExecResult, error) {
	var r api.ExecResult
	err := c.request(ctx, node, OpProcWait, ProcRequest{ID: id, Pid: pid, WaitS: waitS}, &r)
	return r, err
}

// SendStdin writes to a process's stdin.
func (c *Client) SendStdin(ctx context.Context, node, id string, pid int, data []byte) error {
	return c.request(ctx, node, OpProcStdin, ProcRequest{ID: id, Pid: pid, Data: data}, nil)
}

// CloseStdin closes a process's stdin.
func (c *Client) CloseStdin(ctx context.Context, node, id string, pid int) error {
	return c.request(ctx, node, OpProcClose, ProcRequest{ID: id, Pid: pid}, nil)
}

// Signal sends a signal to a process.
func (c *Client) Signal(ctx context.Context, node, id string, pid int, sig string) error {
	return c.request(ctx, node, OpProcSignal, ProcRequest{ID: id, Pid: pid, Signal: sig}, nil)
}
