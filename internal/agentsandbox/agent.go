package agentsandbox

import (
	"context"
	"io"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Capabilities are what a tier offers through the agent: a shell,
// background processes and terminals, and the files API over the
// sandbox's whole root, which is its own.
func Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Shell: true, Processes: true, PTY: true, FileRoot: "/", OwnRoot: true}
}

// Agent is one sandbox's connection to its agent and the sandbox API
// served through it. It is safe for concurrent use.
type Agent struct {
	tier string

	mu     sync.Mutex // guards following fields
	id     string
	client *agentproto.Client
}

// NewAgent returns sandbox id's (of tier) Agent over c, the connection
// Dial or the tier's start made.
func NewAgent(tier, id string, c *agentproto.Client) *Agent {
	return &Agent{tier: tier, id: id, client: c}
}

// Rename gives the sandbox a new ID, which errors name (a container
// tier's warm sandbox taking a request's).
func (a *Agent) Rename(id string) {
	a.mu.Lock()
	a.id = id
	a.mu.Unlock()
}

// Client returns the connection, or sandbox_not_found
// (sandbox.ErrGone) once it is closed.
func (a *Agent) Client() (*agentproto.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client == nil {
		return nil, sandbox.ErrGone(a.id)
	}
	return a.client, nil
}

// Close closes the connection (the sandbox is destroyed, or the node lets
// go of it), failing the calls in progress; later calls fail as
// Client does. Closing again does nothing.
func (a *Agent) Close() {
	a.mu.Lock()
	c := a.client
	a.client = nil
	a.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Command is the agent's request for req in a sandbox of spec, in phase
// p (nil: a sandbox without phases): req's argv (sandbox.Argv, with the
// capabilities of an agent-backed tier), and the phase's user and
// capabilities (the sandbox's without phases). The tier adds what is its
// own (a container's sandbox variables, a terminal).
func (a *Agent) Command(req *sandbox.ExecRequest, spec sandbox.Spec, p *api.Phase) (agentproto.ExecRequest, error) {
	argv, err := sandbox.Argv(a.tier, Capabilities(), req)
	if err != nil {
		return agentproto.ExecRequest{}, err
	}
	cmd := agentproto.ExecRequestFrom(argv, *req)
	cmd.User = commandUser(spec, p)
	return cmd, nil
}

// commandUser is who the commands of phase p (nil: no phases) of spec
// run as, with which capabilities: the phase's user, and the phase's
// capabilities (the sandbox's without phases).
func commandUser(spec sandbox.Spec, p *api.Phase) agentproto.User {
	var u agentproto.User
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

// Exec runs cmd and waits for it. Its output goes to stdout and stderr
// as it comes (nil drops one; with both nil it is collected into the
// result); started, if set, is called once the command runs.
func (a *Agent) Exec(ctx context.Context, cmd agentproto.ExecRequest, stdout, stderr io.Writer, started func()) (api.ExecResult, error) {
	c, err := a.Client()
	if err != nil {
		return api.ExecResult{}, err
	}
	out := outputTo(stdout, stderr)
	if started != nil {
		out.Started = func(int) { started() }
	}
	return c.Exec(ctx, cmd, out)
}

// outputTo is an Output that writes the streams to stdout and stderr
// (nil drops one; both nil: the output is collected into the result).
func outputTo(stdout, stderr io.Writer) agentproto.Output {
	if stdout == nil && stderr == nil {
		return agentproto.Output{}
	}
	return agentproto.Output{Stdout: writerFunc(stdout), Stderr: writerFunc(stderr)}
}

func writerFunc(w io.Writer) func([]byte) {
	if w == nil {
		return nil
	}
	return func(p []byte) { _, _ = w.Write(p) }
}

// Start starts cmd in the background; the process is a Process.
func (a *Agent) Start(ctx context.Context, cmd agentproto.ExecRequest) (sandbox.Process, error) {
	c, err := a.Client()
	if err != nil {
		return nil, err
	}
	p, err := c.Start(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return Process{agent: a, pid: p.Pid}, nil
}

// Processes lists the agent's background processes (none if it cannot
// be reached): sandbox.ProcessRunner's Processes.
func (a *Agent) Processes() []api.Process {
	c, err := a.Client()
	if err != nil {
		return nil
	}
	ps, _ := c.Processes(context.Background())
	return ps
}

// Process returns the agent's process pid (a Process), or its error
// (NotFound for an unknown pid): sandbox.ProcessRunner's Process.
func (a *Agent) Process(pid int) (sandbox.Process, error) {
	c, err := a.Client()
	if err != nil {
		return nil, err
	}
	if _, err := c.Process(context.Background(), pid); err != nil {
		return nil, err
	}
	return Process{agent: a, pid: pid}, nil
}
