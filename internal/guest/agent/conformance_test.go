//go:build linux

package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sandbox/sandboxtest"
)

// The conformance suite runs against a test-only runtime whose sandboxes
// are agents running in this process, each with its own file root, driven
// through agentproto.Client: everything the suite checks goes over the
// protocol. There are no namespaces (the container runtime adds them), so
// commands see the host's file system; the test commands that read and
// write sandbox files prefix paths with $DSEC_TEST_ROOT, which each
// sandbox's default environment sets to its file root, and the memory
// test uses `ulimit -v` for want of a cgroup.

func TestConformance(t *testing.T) {
	sandboxtest.Suite(t, sandboxtest.Factory{
		New: func(t *testing.T, dir string) sandbox.Runtime {
			return &testRuntime{dir: dir}
		},
		Image: sandbox.Image{ID: "host", Name: "host", Root: "/"},
		Commands: sandboxtest.Commands{
			Echo:      func(args ...string) []string { return append([]string{"/bin/echo"}, args...) },
			Cat:       func() []string { return []string{"cat"} },
			Env:       func() []string { return []string{"env"} },
			Exit:      func(code int) []string { return sh("exit " + strconv.Itoa(code)) },
			Sleep:     func(s int) []string { return []string{"sleep", strconv.Itoa(s)} },
			Flood:     func() []string { return []string{"yes"} },
			ReadFile:  func(p string) []string { return onPath(`exec cat -- "$p"`, p) },
			WriteFile: func(p string) []string { return onPath(`exec cat > "$p"`, p) },
			MkFifo:    func(p string) []string { return onPath(`exec mkfifo -- "$p"`, p) },
			AllocMB: func(mb int) []string {
				return sh(`ulimit -v $(( (DSEC_TEST_MEM_MB + 32) * 1024 )) && exec dd if=/dev/zero of=/dev/null bs="$1"M count=1 status=none`, strconv.Itoa(mb))
			},
		},
	})
}

// onPath runs script with $p the sandbox path path as the command sees
// it: an absolute one under the sandbox's file root, a relative one as it
// is (the command's cwd is in the root already).
func onPath(script, path string) []string {
	return sh(`case "$1" in /*) p="$DSEC_TEST_ROOT$1";; *) p="$1";; esac; `+script, path)
}

// agents are the agents of all test runtimes, by socket, so that a
// runtime recovering a sandbox can stop it.
var agents = struct {
	sync.Mutex
	m map[string]*runningAgent
}{m: map[string]*runningAgent{}}

// testRuntime is a sandbox.Runtime over in-process agents. Its state
// directory holds a directory per sandbox with the sandbox's file root and
// a file naming its agent's socket.
type testRuntime struct {
	dir string

	mu  sync.Mutex // guards following fields
	sbs []*testSandbox
}

func (rt *testRuntime) Tier() string { return "agent" }

func (rt *testRuntime) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Shell: true, Processes: true, PTY: true, FileRoot: "/"}
}

func (rt *testRuntime) Fingerprint(context.Context) api.TierInfo {
	return api.TierInfo{Name: rt.Tier(), Available: true, Accelerator: "none"}
}

func (rt *testRuntime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sbDir := filepath.Join(rt.dir, spec.ID)
	root := filepath.Join(sbDir, "root")
	if err := os.MkdirAll(filepath.Join(root, "workspace"), 0o755); err != nil {
		return nil, err
	}
	sockDir, err := os.MkdirTemp("", "dsa")
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(sockDir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	env := []string{agent.DefaultPath, "DSEC_TEST_ROOT=" + root, fmt.Sprintf("DSEC_TEST_MEM_MB=%d", spec.MemoryMB)}
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	actx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{socket: sock, root: root, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- agent.Run(actx, agent.Options{Listener: ln, Root: root, Workdir: filepath.Join(root, "workspace"), DefaultEnv: env, PeerCheck: allowSelf, Version: "test"})
	}()
	agents.Lock()
	agents.m[sock] = r
	agents.Unlock()
	if err := os.WriteFile(filepath.Join(sbDir, "socket"), []byte(sock), 0o644); err != nil {
		return nil, err
	}
	return rt.connect(ctx, spec.ID, sbDir, sock)
}

func (rt *testRuntime) connect(ctx context.Context, id, sbDir, sock string) (*testSandbox, error) {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	c := agentproto.NewClient(conn, nil)
	if _, err := c.Hello(ctx); err != nil {
		c.Close()
		return nil, err
	}
	sb := &testSandbox{id: id, dir: sbDir, socket: sock, c: c, rt: rt}
	rt.mu.Lock()
	rt.sbs = append(rt.sbs, sb)
	rt.mu.Unlock()
	return sb, nil
}

func (rt *testRuntime) Recover(ctx context.Context) ([]sandbox.Sandbox, error) {
	entries, err := os.ReadDir(rt.dir)
	if err != nil {
		return nil, err
	}
	var out []sandbox.Sandbox
	for _, e := range entries {
		sbDir := filepath.Join(rt.dir, e.Name())
		sock, err := os.ReadFile(filepath.Join(sbDir, "socket"))
		if err != nil {
			os.RemoveAll(sbDir)
			continue
		}
		sb, err := rt.connect(ctx, e.Name(), sbDir, string(sock))
		if err != nil {
			os.RemoveAll(sbDir)
			continue
		}
		out = append(out, sb)
	}
	return out, nil
}

// Close closes the runtime's connections; the agents keep running.
func (rt *testRuntime) Close(context.Context) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, sb := range rt.sbs {
		sb.c.Close()
	}
	return nil
}

type testSandbox struct {
	id, dir, socket string
	c               *agentproto.Client
	rt              *testRuntime

	mu        sync.Mutex // guards following fields
	destroyed bool
}

var (
	_ sandbox.Sandbox       = (*testSandbox)(nil)
	_ sandbox.ProcessRunner = (*testSandbox)(nil)
)

func (sb *testSandbox) ID() string { return sb.id }

func (sb *testSandbox) live() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.destroyed {
		return sandbox.ErrGone(sb.id)
	}
	return nil
}

func (sb *testSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	if err := sb.live(); err != nil {
		return api.ExecResult{}, err
	}
	argv, err := sandbox.Argv(sb.rt.Tier(), sb.rt.Capabilities(), &req)
	if err != nil {
		return api.ExecResult{}, err
	}
	areq := agentproto.ExecRequestFrom(argv, sb.inRoot(req))
	if req.Stdout == nil && req.Stderr == nil {
		return sb.c.Exec(ctx, areq, agentproto.Output{})
	}
	// Streamed output is not kept in the result (sandbox.ExecRequest).
	stdout := sandbox.NewCapture(req.MaxOutputBytes, req.Stdout, false)
	stderr := sandbox.NewCapture(req.MaxOutputBytes, req.Stderr, false)
	res, err := sb.c.Exec(ctx, areq, agentproto.Output{
		Stdout: func(b []byte) { stdout.Write(b) },
		Stderr: func(b []byte) { stderr.Write(b) },
	})
	if err != nil {
		return res, err
	}
	_, t1 := stdout.Result()
	_, t2 := stderr.Result()
	res.StdoutTruncated = res.StdoutTruncated || t1
	res.StderrTruncated = res.StderrTruncated || t2
	return res, nil
}

// inRoot puts an absolute cwd in the sandbox's file root, where the
// commands, which see the host's file system, find it.
func (sb *testSandbox) inRoot(req sandbox.ExecRequest) sandbox.ExecRequest {
	if filepath.IsAbs(req.Cwd) {
		req.Cwd = filepath.Join(sb.dir, "root", req.Cwd)
	}
	return req
}

func (sb *testSandbox) Files() sandbox.Files { return (*testFiles)(sb) }

func (sb *testSandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	if err := sb.live(); err != nil {
		return sandbox.Stats{}, err
	}
	st, err := sb.c.Stats(ctx)
	if err != nil {
		return sandbox.Stats{}, err
	}
	return sandbox.Stats{MemoryBytes: st.AgentRSSBytes, Processes: st.Tracked}, nil
}

func (sb *testSandbox) Destroy(ctx context.Context) error {
	sb.mu.Lock()
	if sb.destroyed {
		sb.mu.Unlock()
		return nil
	}
	sb.destroyed = true
	sb.mu.Unlock()
	sb.c.Close()
	agents.Lock()
	r := agents.m[sb.socket]
	delete(agents.m, sb.socket)
	agents.Unlock()
	if r != nil {
		if err := r.stop(); err != nil {
			return err
		}
	}
	os.RemoveAll(filepath.Dir(sb.socket))
	return os.RemoveAll(sb.dir)
}

func (sb *testSandbox) StartProcess(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	if err := sb.live(); err != nil {
		return nil, err
	}
	argv, err := sandbox.Argv(sb.rt.Tier(), sb.rt.Capabilities(), &req)
	if err != nil {
		return nil, err
	}
	p, err := sb.c.Start(ctx, agentproto.ExecRequestFrom(argv, sb.inRoot(req)))
	if err != nil {
		return nil, err
	}
	return &testProcess{sb: sb, info: p}, nil
}

func (sb *testSandbox) Processes() []api.Process {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, _ := sb.c.Processes(ctx)
	return list
}

func (sb *testSandbox) Process(pid int) (sandbox.Process, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := sb.c.Process(ctx, pid)
	if err != nil {
		return nil, err
	}
	return &testProcess{sb: sb, info: p}, nil
}

type testProcess struct {
	sb   *testSandbox
	info api.Process
}

func (p *testProcess) Info() api.Process { return p.info }

func (p *testProcess) Wait(ctx context.Context) (api.ExecResult, error) {
	return p.sb.c.Wait(ctx, p.info.Pid)
}

func (p *testProcess) WriteStdin(ctx context.Context, b []byte) error {
	return p.sb.c.WriteStdin(ctx, p.info.Pid, b)
}

func (p *testProcess) CloseStdin() error {
	return p.sb.c.CloseStdin(context.Background(), p.info.Pid)
}

func (p *testProcess) Signal(sig string) error {
	return p.sb.c.Signal(context.Background(), p.info.Pid, sig)
}

type testFiles testSandbox

func (f *testFiles) sb() *testSandbox { return (*testSandbox)(f) }

func (f *testFiles) Open(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	if err := f.sb().live(); err != nil {
		return nil, api.FileInfo{}, err
	}
	return f.c.Open(ctx, p)
}

func (f *testFiles) Write(ctx context.Context, p string, r io.Reader, opt sandbox.WriteOptions) (api.FileInfo, error) {
	if err := f.sb().live(); err != nil {
		return api.FileInfo{}, err
	}
	return f.c.Write(ctx, p, r, opt)
}

func (f *testFiles) List(ctx context.Context, p string, depth int) ([]api.FileInfo, error) {
	if err := f.sb().live(); err != nil {
		return nil, err
	}
	return f.c.List(ctx, p, depth)
}

func (f *testFiles) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	if err := f.sb().live(); err != nil {
		return api.FileInfo{}, err
	}
	return f.c.Stat(ctx, p)
}

func (f *testFiles) Mkdir(ctx context.Context, p string, parents bool) (api.FileInfo, error) {
	if err := f.sb().live(); err != nil {
		return api.FileInfo{}, err
	}
	return f.c.Mkdir(ctx, p, parents)
}

func (f *testFiles) Remove(ctx context.Context, p string, recursive bool) error {
	if err := f.sb().live(); err != nil {
		return err
	}
	return f.c.Remove(ctx, p, recursive)
}

func (f *testFiles) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	if err := f.sb().live(); err != nil {
		return api.FileInfo{}, err
	}
	return f.c.Rename(ctx, from, to)
}

// TestMissingProgram pins the choice for a program that does not exist:
// an error of class NotFound, code command_not_found, not exit 127.
func TestMissingProgram(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	_, err := c.Exec(ctxT(t, 10*time.Second), agentproto.ExecRequest{Argv: []string{"no-such-program-xyz"}}, agentproto.Output{})
	if !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != "command_not_found" {
		t.Errorf("missing program: err = %v (code %q), want NotFound command_not_found", err, errdefs.CodeOf(err))
	}
	_, err = c.Exec(ctxT(t, 10*time.Second), agentproto.ExecRequest{Argv: []string{"/no/such/program"}}, agentproto.Output{})
	if !errors.Is(err, errdefs.NotFound) {
		t.Errorf("missing program by path: err = %v, want NotFound", err)
	}
}
