package agentsandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/dsec-dev/dsec/internal/testenv"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// fakeAgent serves the protocol on a Unix socket as an agent would, for
// the calls the host side makes, and records what it was asked.
type fakeAgent struct {
	sock     string
	protocol int // what its hello says

	mu    sync.Mutex
	execs []agentproto.ExecArgs
	paths []string // of file calls
	sigs  []agentproto.SignalArgs
}

const fakePid = 7

func startFake(t *testing.T) *fakeAgent {
	t.Helper()
	f := &fakeAgent{sock: filepath.Join(t.TempDir(), "agent.sock"), protocol: agentproto.Protocol}
	l, err := net.Listen("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = agentproto.Serve(ctx, conn, nil, f.handle)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		cancel()
		testenv.WaitGroup(t, &wg, 30*time.Second, "the fake agent's connections")
	})
	return f
}

func (f *fakeAgent) handle(c *agentproto.Call) {
	switch c.Op {
	case agentproto.OpHello:
		c.Reply(agentproto.Hello{Protocol: f.protocol, Pid: 1}, nil)
	case agentproto.OpExec:
		var args agentproto.ExecArgs
		if err := c.Decode(&args); err != nil {
			c.Reply(nil, err)
			return
		}
		f.mu.Lock()
		f.execs = append(f.execs, args)
		f.mu.Unlock()
		if args.Background {
			c.Reply(api.Process{Pid: fakePid, State: api.ProcessRunning}, nil)
			return
		}
		c.Event(agentproto.Started{Pid: fakePid})
		c.Send(agentproto.ChanOut, []byte("out"))
		c.Send(agentproto.ChanErr, []byte("err"))
		c.Reply(api.ExecResult{ExitCode: 3}, nil)
	case agentproto.OpProcesses:
		b, _ := json.Marshal(api.Process{Pid: fakePid, State: api.ProcessRunning})
		c.Send(agentproto.ChanOut, append(b, '\n'))
		c.Reply(struct{}{}, nil)
	case agentproto.OpProcess:
		var args agentproto.PidArgs
		if err := c.Decode(&args); err != nil {
			c.Reply(nil, err)
			return
		}
		if args.Pid != fakePid {
			c.Reply(nil, errdefs.New(errdefs.NotFound, "process_not_found", "no process %d", args.Pid))
			return
		}
		c.Reply(api.Process{Pid: fakePid, State: api.ProcessRunning}, nil)
	case agentproto.OpSignal:
		var args agentproto.SignalArgs
		if err := c.Decode(&args); err != nil {
			c.Reply(nil, err)
			return
		}
		f.mu.Lock()
		f.sigs = append(f.sigs, args)
		f.mu.Unlock()
		c.Reply(struct{}{}, nil)
	case agentproto.OpStat:
		var args agentproto.PathArgs
		if err := c.Decode(&args); err != nil {
			c.Reply(nil, err)
			return
		}
		f.mu.Lock()
		f.paths = append(f.paths, args.Path)
		f.mu.Unlock()
		if args.Path == "/missing" {
			c.Reply(nil, errdefs.New(errdefs.NotFound, sandbox.CodeFileNotFound, "%s does not exist", args.Path))
			return
		}
		c.Reply(api.FileInfo{Path: args.Path, Type: api.FileTypeFile}, nil)
	default:
		c.Reply(nil, errdefs.New(errdefs.Unsupported, "unknown_op", "no %s", c.Op))
	}
}

// dialFake connects an Agent for sandbox id to f.
func dialFake(t *testing.T, f *fakeAgent, id string) *Agent {
	t.Helper()
	c, err := Dial(context.Background(), f.sock, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAgent("container", id, c)
	t.Cleanup(a.Close)
	return a
}

// TestDial: Dial greets the agent, calls connected in between, and fails
// on an agent of another protocol or none at all.
func TestDial(t *testing.T) {
	f := startFake(t)
	ctx := context.Background()
	connected := false
	c, err := Dial(ctx, f.sock, nil, func() { connected = true })
	if err != nil || !connected {
		t.Fatalf("Dial: %v (connected %v)", err, connected)
	}
	c.Close()

	f.protocol = agentproto.Protocol + 1
	if _, err := Dial(ctx, f.sock, nil, nil); errdefs.CodeOf(err) != "agent_protocol_mismatch" {
		t.Errorf("Dial to another protocol: %v", err)
	}
	connected = false
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "none.sock"), nil, func() { connected = true }); err == nil || connected {
		t.Errorf("Dial to no socket: %v (connected %v)", err, connected)
	}
}

// TestCommand: a request becomes the agent's command with its argv (a
// shell line through /bin/sh) and the phase's user and capabilities, the
// sandbox's without phases.
func TestCommand(t *testing.T) {
	a := NewAgent("microvm", "sb", nil)
	spec := sandbox.Spec{ID: "sb", Capabilities: []string{"CAP_NET_BIND_SERVICE"}}
	req := sandbox.ExecRequest{ExecRequest: api.ExecRequest{Command: "echo hi", Cwd: "/tmp", Env: map[string]string{"A": "b"}, TimeoutS: 5}}
	cmd, err := a.Command(&req, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cmd.Argv, []string{"/bin/sh", "-c", "echo hi"}) || cmd.Cwd != "/tmp" || cmd.Env["A"] != "b" || cmd.TimeoutS != 5 {
		t.Errorf("command %+v", cmd)
	}
	if cmd.User.UID != 0 || !slices.Equal(cmd.User.Caps, []uint{10}) {
		t.Errorf("without phases: user %+v, want root with CAP_NET_BIND_SERVICE (10)", cmd.User)
	}
	p := &api.Phase{Name: "run", User: "1000:1001", Capabilities: []string{}}
	if cmd, err = a.Command(&req, spec, p); err != nil || cmd.User.UID != 1000 || cmd.User.GID != 1001 || len(cmd.User.Caps) != 0 {
		t.Errorf("in phase run: %+v, %v", cmd.User, err)
	}
	bad := sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"ls"}, Command: "ls"}}
	if _, err := a.Command(&bad, spec, nil); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("cmd and command: %v", err)
	}
}

// TestExec: the output streams to the request's writers, started runs
// once the command does, and the command reaches the agent as built.
func TestExec(t *testing.T) {
	f := startFake(t)
	a := dialFake(t, f, "sb")
	ctx := context.Background()
	req := sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}
	cmd, err := a.Command(&req, sandbox.Spec{ID: "sb"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = map[string]string{"HOSTNAME": "sb"}
	var stdout, stderr bytes.Buffer
	started := 0
	res, err := a.Exec(ctx, cmd, &stdout, &stderr, func() { started++ })
	if err != nil || res.ExitCode != 3 || stdout.String() != "out" || stderr.String() != "err" || started != 1 {
		t.Fatalf("Exec: %+v %v; stdout %q stderr %q started %d", res, err, stdout.String(), stderr.String(), started)
	}
	// Without writers the output is collected.
	if res, err = a.Exec(ctx, cmd, nil, nil, nil); err != nil || res.Stdout != "out" || res.Stderr != "err" {
		t.Errorf("collected: %+v %v", res, err)
	}
	f.mu.Lock()
	got := f.execs[0]
	f.mu.Unlock()
	if !slices.Equal(got.Argv, []string{"true"}) || got.Env["HOSTNAME"] != "sb" || got.Background {
		t.Errorf("the agent got %+v", got)
	}
}

// TestProcesses: a background process is a Process addressed by pid
// through the agent; an unknown pid is the agent's NotFound.
func TestProcesses(t *testing.T) {
	f := startFake(t)
	a := dialFake(t, f, "sb")
	ctx := context.Background()
	p, err := a.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "9"}})
	if err != nil {
		t.Fatal(err)
	}
	if info := p.Info(); info.Pid != fakePid || info.State != api.ProcessRunning {
		t.Errorf("Info = %+v", info)
	}
	if err := p.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	sigs := slices.Clone(f.sigs)
	f.mu.Unlock()
	if len(sigs) != 1 || sigs[0].Pid != fakePid || sigs[0].Signal != "TERM" {
		t.Errorf("signals %+v", sigs)
	}
	if ps := a.Processes(); len(ps) != 1 || ps[0].Pid != fakePid {
		t.Errorf("Processes = %+v", ps)
	}
	if _, err := a.Process(fakePid); err != nil {
		t.Errorf("Process(%d): %v", fakePid, err)
	}
	if _, err := a.Process(99); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Process(99): %v", err)
	}
}

// TestFiles: paths are cleaned before they reach the agent (relative
// ones under sandbox.Workdir), a path that fails cleaning never does, and
// checked sees every error.
func TestFiles(t *testing.T) {
	f := startFake(t)
	a := dialFake(t, f, "sb")
	ctx := context.Background()
	var checked []string
	files := a.Files(func(op, p string, err error) error {
		if err != nil {
			checked = append(checked, op+" "+p)
		}
		return err
	})
	if fi, err := files.Stat(ctx, "/etc//hosts/"); err != nil || fi.Path != "/etc/hosts" {
		t.Errorf("Stat: %+v %v", fi, err)
	}
	if _, err := files.Stat(ctx, "notes.txt"); err != nil {
		t.Errorf("Stat of a relative path: %v", err)
	}
	if _, err := files.Stat(ctx, "/missing"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Stat of a missing file: %v", err)
	}
	if _, err := files.Stat(ctx, "/a\x00b"); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("Stat of a NUL path: %v", err)
	}
	f.mu.Lock()
	paths := slices.Clone(f.paths)
	f.mu.Unlock()
	if want := []string{"/etc/hosts", sandbox.Workdir + "/notes.txt", "/missing"}; !slices.Equal(paths, want) {
		t.Errorf("the agent got %q, want %q", paths, want)
	}
	if want := []string{"stat /missing", "path /a\x00b"}; !slices.Equal(checked, want) {
		t.Errorf("checked %q, want %q", checked, want)
	}
	if _, err := a.Files(nil).Stat(ctx, "/missing"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Stat without checked: %v", err)
	}
}

// TestClose: once the connection is closed every call is the sandbox's
// absence (sandbox_not_found, under its latest ID), and a process handle
// reads as exited.
func TestClose(t *testing.T) {
	f := startFake(t)
	a := dialFake(t, f, "warm-1")
	ctx := context.Background()
	p, err := a.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "9"}})
	if err != nil {
		t.Fatal(err)
	}
	a.Rename("sb")
	a.Close()
	a.Close() // again: nothing
	_, err = a.Client()
	if errdefs.CodeOf(err) != "sandbox_not_found" || errdefs.MessageOf(err) != errdefs.MessageOf(sandbox.ErrGone("sb")) {
		t.Errorf("Client after Close: %v", err)
	}
	if _, err := a.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Exec after Close: %v", err)
	}
	if _, err := a.Files(nil).Stat(ctx, "/"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Stat after Close: %v", err)
	}
	if ps := a.Processes(); ps != nil {
		t.Errorf("Processes after Close: %v", ps)
	}
	if info := p.Info(); info.State != api.ProcessExited {
		t.Errorf("a process after Close: %+v", info)
	}
	if _, err := p.Wait(ctx); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Wait after Close: %v", err)
	}
}

// TestEnds: an end is released first, then told, with destroy's error
// returned; without OnEnd nobody is told.
func TestEnds(t *testing.T) {
	var e Ends
	var order []string
	end := sandbox.Ended{ID: "sb", Code: sandbox.EndAgentExited}
	destroy := func(ctx context.Context) error {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > destroyWait {
			t.Errorf("destroy's context has no deadline within %s", destroyWait)
		}
		order = append(order, "destroy")
		return errors.New("busy")
	}
	if err := e.Ended(end, destroy); err == nil || err.Error() != "busy" {
		t.Errorf("Ended without OnEnd: %v", err)
	}
	e.OnEnd(func(got sandbox.Ended) {
		if got.ID != end.ID {
			t.Errorf("told of %+v", got)
		}
		order = append(order, "told")
	})
	e.Ended(end, destroy)
	if want := []string{"destroy", "destroy", "told"}; !slices.Equal(order, want) {
		t.Errorf("order %q, want %q", order, want)
	}
}
