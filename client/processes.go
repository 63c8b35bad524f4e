package client

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/dsec-dev/dsec/api"
)

func processPath(id string, pid int, suffix string) (string, error) {
	if pid <= 0 {
		return "", errors.New("process ID must be positive")
	}
	return sandboxPath(id, "/processes/"+strconv.Itoa(pid)+suffix)
}

// StartProcess starts a background process in the sandbox id.
func (c *Client) StartProcess(ctx context.Context, id string, req api.ExecRequest) (*api.Process, error) {
	p, err := sandboxPath(id, "/processes")
	if err != nil {
		return nil, err
	}
	var pr api.Process
	if err := c.call(ctx, http.MethodPost, p, req, &pr, 0); err != nil {
		return nil, err
	}
	return &pr, nil
}

// ListProcesses lists the background processes of the sandbox id.
func (c *Client) ListProcesses(ctx context.Context, id string) (*api.ProcessList, error) {
	p, err := sandboxPath(id, "/processes")
	if err != nil {
		return nil, err
	}
	var l api.ProcessList
	if err := c.call(ctx, http.MethodGet, p, nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetProcess describes a background process.
func (c *Client) GetProcess(ctx context.Context, id string, pid int) (*api.Process, error) {
	p, err := processPath(id, pid, "")
	if err != nil {
		return nil, err
	}
	var pr api.Process
	if err := c.call(ctx, http.MethodGet, p, nil, &pr, 0); err != nil {
		return nil, err
	}
	return &pr, nil
}

// WaitProcess waits up to timeout (0: the server's default, 60 s) for a
// background process to exit and returns its result. If it is still
// running then, the error is of class deadline_exceeded.
func (c *Client) WaitProcess(ctx context.Context, id string, pid int, timeout time.Duration) (*api.ExecResult, error) {
	p, err := processPath(id, pid, "/wait")
	if err != nil {
		return nil, err
	}
	if timeout > 0 {
		p += "?timeout_s=" + strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64)
	}
	var res api.ExecResult
	if err := c.call(ctx, http.MethodPost, p, nil, &res, commandTime(timeout.Seconds())); err != nil {
		return nil, err
	}
	return &res, nil
}

// SendStdin writes data to a background process's standard input.
func (c *Client) SendStdin(ctx context.Context, id string, pid int, data string) error {
	p, err := processPath(id, pid, "/stdin")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, p, api.StdinRequest{Data: data}, nil, 0)
}

// CloseStdin closes a background process's standard input.
func (c *Client) CloseStdin(ctx context.Context, id string, pid int) error {
	p, err := processPath(id, pid, "/stdin/close")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, p, nil, nil, 0)
}

// KillProcess sends signal (a name such as "TERM"; "" means KILL) to a
// background process.
func (c *Client) KillProcess(ctx context.Context, id string, pid int, signal string) error {
	p, err := processPath(id, pid, "/kill")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, p, api.SignalRequest{Signal: signal}, nil, 0)
}
