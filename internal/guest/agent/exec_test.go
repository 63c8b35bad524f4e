//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// pattern is what `yes word | head -c n` prints.
func pattern(word string, n int) string {
	return strings.Repeat(word+"\n", n/(len(word)+1)+1)[:n]
}

// TestConcurrentLargeOutputs runs many commands with large outputs at
// once on one connection, while one more has a streaming reader that does
// not read: the others finish, each with exactly its own output, and the
// stalled one completes once its reader resumes.
func TestConcurrentLargeOutputs(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	const size = 2 << 20
	const stalledSize = 8 << 20

	release := make(chan struct{})
	stalledDone := make(chan error, 1)
	var stalledOut bytes.Buffer
	go func() {
		blocked := false
		res, err := c.Exec(ctxT(t, 60*time.Second), agentproto.ExecRequest{
			Argv:           sh(fmt.Sprintf("yes stalled | head -c %d", stalledSize)),
			MaxOutputBytes: 16 << 20,
			TimeoutS:       60,
		}, agentproto.Output{Stdout: func(b []byte) {
			if !blocked {
				blocked = true
				<-release
			}
			stalledOut.Write(b)
		}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d", res.ExitCode)
		}
		stalledDone <- err
	}()

	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			word := fmt.Sprintf("call-%d", i)
			res, err := c.Exec(ctxT(t, 60*time.Second), agentproto.ExecRequest{
				Argv:     sh(fmt.Sprintf("yes %s | head -c %d; echo done-%d >&2", word, size, i)),
				TimeoutS: 60,
			}, agentproto.Output{})
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d: %v", i, err)
			case res.Stdout != pattern(word, size):
				errs <- fmt.Errorf("call %d: stdout of %d bytes is not its own output", i, len(res.Stdout))
			case res.Stderr != fmt.Sprintf("done-%d\n", i):
				errs <- fmt.Errorf("call %d: stderr %q", i, res.Stderr)
			}
		}()
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent calls")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("16 × 2 MiB with one stalled reader: %v", time.Since(start))
	select {
	case err := <-stalledDone:
		t.Fatalf("the stalled call ended while its reader was blocked: %v", err)
	default:
	}
	close(release)
	if err := testenv.Recv(t, stalledDone, time.Minute, "the stalled call to end once released"); err != nil {
		t.Fatalf("stalled call: %v", err)
	}
	if stalledOut.String() != pattern("stalled", stalledSize) {
		t.Errorf("stalled call: got %d bytes, not its output", stalledOut.Len())
	}
}

// TestStreaming checks the callbacks: pid first, then output in order,
// within the cap.
func TestStreaming(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	var (
		pid      int
		out, err bytes.Buffer
		order    []string
	)
	res, e := c.Exec(ctxT(t, 30*time.Second), agentproto.ExecRequest{
		Argv:           sh("echo one; echo two >&2; yes | head -c 5000"),
		MaxOutputBytes: 1000,
	}, agentproto.Output{
		Started: func(p int) { pid = p; order = append(order, "started") },
		Stdout:  func(b []byte) { out.Write(b); order = append(order, "out") },
		Stderr:  func(b []byte) { err.Write(b); order = append(order, "err") },
	})
	if e != nil {
		t.Fatal(e)
	}
	if pid <= 0 || order[0] != "started" {
		t.Errorf("Started: pid %d, order %q", pid, order)
	}
	if out.Len() != 1000 || !strings.HasPrefix(out.String(), "one\ny\n") || !res.StdoutTruncated {
		t.Errorf("stdout %d bytes %q…, truncated %v", out.Len(), out.String()[:min(10, out.Len())], res.StdoutTruncated)
	}
	if err.String() != "two\n" || res.StderrTruncated {
		t.Errorf("stderr %q", err.String())
	}
	if res.Stdout != "" || res.Stderr != "" {
		t.Errorf("streamed result carries output: %+v", res)
	}
}

// pidFile returns a path for a command to write a pid to, and a reader.
func pidFile(t *testing.T) (string, func() int) {
	p := filepath.Join(t.TempDir(), "pid")
	return p, func() int {
		var pid int
		waitFor(t, "the pid file", func() bool {
			b, err := os.ReadFile(p)
			if err != nil {
				return false
			}
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil
		})
		return pid
	}
}

func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// A zombie is dead too; its parent (not ours once orphaned) reaps it.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// TestTimeoutKillsProcessGroup: a timeout kills the command and the
// children it started in its process group.
func TestTimeoutKillsProcessGroup(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	file, read := pidFile(t)
	start := time.Now()
	res := run(t, c, agentproto.ExecRequest{Argv: sh(`sleep 100 & echo $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`, file), TimeoutS: 0.5})
	if !res.TimedOut || res.ExitCode != -1 || res.Error != "timeout" {
		t.Errorf("result %+v, want a timeout", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %v", d)
	}
	child := read()
	waitFor(t, "the child to die", func() bool { return gone(child) })
}

// TestCancelKillsCommand: cancelling the context kills the command.
func TestCancelKillsCommand(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	file, read := pidFile(t)
	ctx := ctxT(t, 30*time.Second)
	done := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := c.Exec(cctx, agentproto.ExecRequest{Argv: sh(`echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 100`, file), TimeoutS: 60}, agentproto.Output{})
		done <- err
	}()
	pid := read()
	cancel()
	if err := testenv.Recv(t, done, time.Minute, "the cancelled exec to return"); err == nil {
		t.Error("Exec succeeded after cancel")
	}
	waitFor(t, "the command to die", func() bool { return gone(pid) })
	// The connection still works.
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"echo", "after"}}); res.Stdout != "after\n" {
		t.Errorf("after cancel: %+v", res)
	}
}

// TestBackgroundChildDoesNotHoldExec: a command that leaves a process
// holding its output open still returns once it exits.
func TestBackgroundChildDoesNotHoldExec(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	start := time.Now()
	res := run(t, c, agentproto.ExecRequest{Argv: sh(`sleep 30 & echo $!`), TimeoutS: 20})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("exec took %v", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// TestStdinNotRead: a command that exits without reading a large stdin
// stream returns at once.
func TestStdinNotRead(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	start := time.Now()
	res, err := c.Exec(ctxT(t, 30*time.Second), agentproto.ExecRequest{
		Argv:        []string{"true"},
		StdinReader: bytes.NewReader(make([]byte, 32<<20)),
	}, agentproto.Output{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %+v, %v", res, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// TestEnvironment: commands get the defaults under the request's
// variables, never the agent's own environment, and PWD naming their
// working directory as the node sees it (in the file root), whatever the
// request says.
func TestEnvironment(t *testing.T) {
	t.Setenv("DSEC_AGENT_SECRET", "do-not-leak")
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "workspace"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, _ := newAgent(t, agent.Options{Root: root, Workdir: filepath.Join(root, "workspace"),
		DefaultEnv: []string{agent.DefaultPath, "A=default", "B=default"}})
	res := run(t, c, agentproto.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"B": "request", "C": "new", "PWD": "/elsewhere"}})
	got := lines(res.Stdout)
	slices.Sort(got)
	want := []string{"A=default", agent.DefaultPath, "B=request", "C=new", "PWD=/workspace"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("env = %q, want %q", got, want)
	}
	_, err := c.Exec(ctxT(t, 10*time.Second), agentproto.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"A=B": "x"}}, agentproto.Output{})
	if !errors.Is(err, errdefs.Invalid) {
		t.Errorf("bad variable name: err = %v, want Invalid", err)
	}
}

func TestWorkingDirectory(t *testing.T) {
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, _ := newAgent(t, agent.Options{Workdir: work})
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"pwd"}}); res.Stdout != work+"\n" {
		t.Errorf("default cwd: %q", res.Stdout)
	}
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"}); res.Stdout != work+"/sub\n" {
		t.Errorf("relative cwd: %q", res.Stdout)
	}
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "/"}); res.Stdout != "/\n" {
		t.Errorf("absolute cwd: %q", res.Stdout)
	}
	_, err := c.Exec(ctxT(t, 10*time.Second), agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "/no/such/dir"}, agentproto.Output{})
	if !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != "cwd_not_found" {
		t.Errorf("missing cwd: err = %v", err)
	}
}

func TestUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	c, _ := newAgent(t, agent.Options{})
	res := run(t, c, agentproto.ExecRequest{Argv: sh("id -u; id -g; id -G"), User: agentproto.User{UID: 65534, GID: 65534}})
	if res.Stdout != "65534\n65534\n65534\n" {
		t.Errorf("as 65534:65534: %+v", res)
	}
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"id", "-u"}}); res.Stdout != "0\n" {
		t.Errorf("default user: %+v", res)
	}
}

// TestNoDescriptorLeak: commands get descriptors 0, 1 and 2 only, even
// one the agent's process inherited without close-on-exec, and running
// commands leaves no descriptors open in the agent.
func TestNoDescriptorLeak(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil { // no O_CLOEXEC
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	c, _ := newAgent(t, agent.Options{})
	// ls opens the directory itself: descriptor 3.
	res := run(t, c, agentproto.ExecRequest{Argv: []string{"ls", "/proc/self/fd"}})
	if got := lines(res.Stdout); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("a command's descriptors: %q", got)
	}
	res = run(t, c, agentproto.ExecRequest{Argv: []string{"ls", "/proc/self/fd"}, PTY: &agentproto.PTYSize{Rows: 24, Cols: 80}})
	if got := strings.Fields(res.Stdout); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("a PTY command's descriptors: %q", got)
	}

	before := openFDs(t)
	for range 20 {
		run(t, c, agentproto.ExecRequest{Argv: []string{"echo"}, Stdin: "x"})
		run(t, c, agentproto.ExecRequest{Argv: []string{"true"}, PTY: &agentproto.PTYSize{Rows: 24, Cols: 80}})
	}
	if after := openFDs(t); after > before {
		t.Errorf("the agent's process has %d descriptors after 40 commands, %d before", after, before)
	}
}

func openFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}
