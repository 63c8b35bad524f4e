//go:build linux

package agent_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestRequireOutsidePIDNamespace(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer agent.Peer
		ok   bool
	}{
		{"outside the namespace", agent.Peer{Pid: 0, Uid: 0}, true},
		{"outside, unmapped uid", agent.Peer{Pid: 0, Uid: 65534, Gid: 65534}, true},
		{"a sandbox process", agent.Peer{Pid: 42, Uid: 0}, false},
		{"sandbox PID 1 itself", agent.Peer{Pid: 1}, false},
		{"an unprivileged sandbox process", agent.Peer{Pid: 7, Uid: 1000, Gid: 1000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := agent.RequireOutsidePIDNamespace(tc.peer)
			if (err == nil) != tc.ok {
				t.Errorf("RequireOutsidePIDNamespace(%+v) = %v, want ok=%v", tc.peer, err, tc.ok)
			}
			if err != nil && !errors.Is(err, errdefs.PermissionDenied) {
				t.Errorf("err = %v, want PermissionDenied", err)
			}
		})
	}
}

// TestDefaultPeerCheckRefusesSameNamespace: with the default check, an
// agent refuses a client in its own pid namespace (here: this test).
func TestDefaultPeerCheckRefusesSameNamespace(t *testing.T) {
	r := launch(t, agent.Options{PeerCheck: agent.RequireOutsidePIDNamespace})
	defer r.stop()
	conn, err := net.Dial("unix", r.socket)
	if err != nil {
		t.Fatal(err)
	}
	c := agentproto.NewClient(conn, nil)
	defer c.Close()
	_, err = c.Hello(ctxT(t, 10*time.Second))
	if !errors.Is(err, errdefs.Unavailable) || errdefs.CodeOf(err) != "agent_gone" {
		t.Errorf("Hello from the agent's namespace: err = %v, want agent_gone", err)
	}
}

// childAgent is this test binary serving as the agent (serve mode) in a
// child process, as PID 1 of a new pid namespace.
type childAgent struct {
	socket string
	cmd    *exec.Cmd
	stdin  io.Closer
	stderr bytes.Buffer
	exited bool
}

// startChildAgent starts a childAgent and waits for its socket; it is
// killed with the test unless stopped.
func startChildAgent(t testing.TB) *childAgent {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for CLONE_NEWPID")
	}
	ca := &childAgent{socket: filepath.Join(socketDir(t), "agent.sock")}
	ca.cmd = exec.Command(os.Args[0])
	ca.cmd.Env = append(os.Environ(), "DSEC_AGENT_TEST_MODE=serve", "DSEC_AGENT_TEST_SOCKET="+ca.socket, "DSEC_AGENT_TEST_ROOT="+t.TempDir(), "GORACE=atexit_sleep_ms=0")
	ca.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	ca.cmd.Stderr = &ca.stderr
	stdin, err := ca.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	ca.stdin = stdin
	if err := ca.cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
			t.Skipf("cannot create a pid namespace: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !ca.exited {
			ca.cmd.Process.Kill()
			_ = testenv.WaitCmd(t, ca.cmd, time.Minute, "the child agent to exit after SIGKILL")
		}
	})
	waitFor(t, "the agent's socket", func() bool { _, err := os.Stat(ca.socket); return err == nil })
	return ca
}

// stop ends the agent by closing its stdin and returns how it exited.
func (ca *childAgent) stop() error {
	ca.stdin.Close()
	ca.exited = true
	// bounded: closing stdin ends the child agent; pidns tests bound their own run
	if err := ca.cmd.Wait(); err != nil {
		return fmt.Errorf("%w:\n%s", err, ca.stderr.String())
	}
	return nil
}

// TestPIDNamespace runs the agent as PID 1 of a new pid namespace (a
// child of this test in serve mode), as a container sandbox does, and
// checks what only holds there: the node outside is accepted (peer pid 0)
// while a process of the sandbox that reaches the socket is refused;
// signals sent to PID 1 from inside are ignored; orphans are reaped.
func TestPIDNamespace(t *testing.T) {
	ca := startChildAgent(t)
	sock := ca.socket
	var stderr = &ca.stderr
	cmd := ca.cmd
	c := dial(t, sock)
	defer c.Close()
	h, err := c.Hello(ctxT(t, 10*time.Second))
	if err != nil || h.Pid != 1 || h.AgentVersion != "test-child" {
		t.Fatalf("Hello = %+v, %v", h, err)
	}

	// A sandbox process reaching the socket is refused.
	res := run(t, c, agentproto.ExecRequest{
		Argv: []string{os.Args[0]},
		Env:  map[string]string{"DSEC_AGENT_TEST_MODE": "probe", "DSEC_AGENT_TEST_SOCKET": sock, "GORACE": "atexit_sleep_ms=0"},
	})
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "refused:") {
		t.Errorf("probe from inside the sandbox: %+v", res)
	}

	// Signals from inside do not reach PID 1.
	res = run(t, c, agentproto.ExecRequest{Argv: sh("for s in TERM INT HUP QUIT USR1 USR2 SEGV ABRT PIPE ALRM; do kill -s $s 1; done; echo sent")})
	if res.Stdout != "sent\n" {
		t.Errorf("kill 1: %+v", res)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := c.Hello(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("the agent did not survive signals from inside: %v\n%s", err, stderr.String())
	}

	// Orphans are reparented to PID 1 and reaped.
	res = run(t, c, agentproto.ExecRequest{Argv: sh("for i in 1 2 3 4 5; do sleep 0.1 & done; echo $!")})
	if res.ExitCode != 0 {
		t.Fatalf("orphans: %+v", res)
	}
	waitFor(t, "the orphans to be reaped", func() bool { return len(children(t, cmd.Process.Pid, false)) == 0 })

	// A background process and the end of the namespace.
	p, err := c.Start(ctxT(t, 5*time.Second), agentproto.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid < 2 || p.Pid > 1000 {
		t.Errorf("pid %d in the new namespace", p.Pid)
	}
	if err := ca.stop(); err != nil { // the agent kills its processes
		t.Errorf("agent exited with %v", err)
	}
}

// children lists pid's children (of any of its threads); zombies only if
// zombies is set.
func children(t *testing.T, pid int, zombies bool) []int {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			if !zombies || procState(n) == "Z" {
				out = append(out, n)
			}
		}
	}
	return out
}
