//go:build linux

package agent_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestMain lets the test binary act as a standalone agent or as a probe
// client when a test runs it as a child (see runMode), and checks that
// the tests leave no goroutines behind.
func TestMain(m *testing.M) {
	if mode := os.Getenv("DSEC_AGENT_TEST_MODE"); mode != "" {
		os.Exit(runMode(mode))
	}
	base := testenv.Goroutines()
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		for testenv.Goroutines() > base && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := testenv.Goroutines(); n > base {
			fmt.Fprintf(os.Stderr, "goroutine leak: %d goroutines at the end, %d at the start\n", n, base)
			code = 1
		}
	}
	os.Exit(code)
}

// socketDir returns a short directory for Unix sockets (their paths are
// limited to 108 bytes; test temp dirs can be longer).
func socketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dsa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// allowSelf accepts connections from this test process only: the agent
// runs in the test's own pid namespace, where the default check would
// refuse everyone.
func allowSelf(p agent.Peer) error {
	if int(p.Pid) != os.Getpid() {
		return fmt.Errorf("peer pid %d is not the test", p.Pid)
	}
	return nil
}

// runningAgent is an agent running in this process.
type runningAgent struct {
	socket string
	root   string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (r *runningAgent) stop() error {
	var err error
	r.once.Do(func() {
		r.cancel()
		select {
		case err = <-r.done:
		case <-time.After(30 * time.Second):
			err = fmt.Errorf("the agent on %s did not stop within 30s of its cancel", r.socket)
		}
	})
	return err
}

// launch starts an agent in this process on a new socket. opt.Root
// defaults to a new temporary directory with a workspace in it.
func launch(t testing.TB, opt agent.Options) *runningAgent {
	t.Helper()
	sock := filepath.Join(socketDir(t), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if opt.Root == "" {
		opt.Root = t.TempDir()
		if err := os.Mkdir(filepath.Join(opt.Root, "workspace"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if opt.PeerCheck == nil {
		opt.PeerCheck = allowSelf
	}
	opt.Listener = ln
	opt.Version = "test"
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{socket: sock, root: opt.Root, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- agent.Run(ctx, opt) }()
	return r
}

// dial connects a client to a running agent and says hello.
func dial(t testing.TB, socket string) *agentproto.Client {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	c := agentproto.NewClient(conn, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Hello(ctx); err != nil {
		c.Close()
		t.Fatalf("Hello: %v", err)
	}
	return c
}

// newAgent starts an agent and a client to it, both stopped with the test.
func newAgent(t testing.TB, opt agent.Options) (*agentproto.Client, *runningAgent) {
	t.Helper()
	r := launch(t, opt)
	c := dial(t, r.socket)
	t.Cleanup(func() {
		c.Close()
		if err := r.stop(); err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	})
	return c, r
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// run executes argv and fails the test on an error.
func run(t testing.TB, c *agentproto.Client, req agentproto.ExecRequest) api.ExecResult {
	t.Helper()
	if req.TimeoutS == 0 {
		req.TimeoutS = 30
	}
	res, err := c.Exec(ctxT(t, 60*time.Second), req, agentproto.Output{})
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Argv, err)
	}
	return res
}

func sh(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "sh"}, args...)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func lines(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == '\n' })
}
