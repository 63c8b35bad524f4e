package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

func sandboxID(t *testing.T, n int) string {
	return fmt.Sprintf("sbt-%d-%d", time.Now().UnixNano()%1e9, n)
}

func run(t *testing.T, sb sandbox.Sandbox, req api.ExecRequest) api.ExecResult {
	t.Helper()
	if req.TimeoutS == 0 {
		req.TimeoutS = 60
	}
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: req})
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Cmd, err)
	}
	return res
}

func testFingerprint(t *testing.T, f Factory) {
	e := newEnv(t, f)
	info := e.rt.Fingerprint(context.Background())
	if info.Name != e.rt.Tier() || !info.Available {
		t.Fatalf("Fingerprint = %+v, want available tier %q", info, e.rt.Tier())
	}
	if info.Accelerator == "" {
		t.Errorf("Fingerprint has no accelerator")
	}
	if root := e.rt.Capabilities().FileRoot; root == "" || root[0] != '/' || !sandbox.Within(root, sandbox.Workdir) {
		t.Errorf("Capabilities().FileRoot = %q, want an absolute path holding %s", root, sandbox.Workdir)
	}
}

func testExecEcho(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Echo("hello", "world")})
	if res.ExitCode != 0 || res.Stdout != "hello world\n" || res.Stderr != "" {
		t.Fatalf("echo: %+v", res)
	}
	if res.DurationMS <= 0 || res.StdoutTruncated || res.TimedOut || res.Error != "" {
		t.Errorf("echo result fields: %+v", res)
	}
}

func testExitCode(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	for _, code := range []int{0, 1, 3, 42} {
		res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Exit(code)})
		if res.ExitCode != code {
			t.Errorf("exit %d: got %+v", code, res)
		}
	}
}

func testStdin(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Cat(), Stdin: "line one\nline two\n"})
	if res.ExitCode != 0 || res.Stdout != "line one\nline two\n" {
		t.Fatalf("cat with stdin string: %+v", res)
	}
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB
	r, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		ExecRequest: api.ExecRequest{Cmd: f.Commands.Cat(), TimeoutS: 60},
		Stdin:       strings.NewReader(big),
	})
	if err != nil || r.ExitCode != 0 || r.Stdout != big {
		t.Fatalf("cat with stdin reader: err=%v exit=%d len=%d", err, r.ExitCode, len(r.Stdout))
	}
}

func testEnv(t *testing.T, f Factory) {
	e := newEnv(t, f)
	spec := e.spec()
	spec.Env = map[string]string{"FROM_SPEC": "s", "OVERRIDDEN": "spec"}
	sb := e.create(spec)
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Env(), Env: map[string]string{"FROM_REQ": "r", "OVERRIDDEN": "req"}})
	for _, want := range []string{"FROM_SPEC=s", "FROM_REQ=r", "OVERRIDDEN=req"} {
		if !containsLine(res.Stdout, want) {
			t.Errorf("env output lacks %q:\n%s", want, res.Stdout)
		}
	}
	if containsLine(res.Stdout, "OVERRIDDEN=spec") {
		t.Errorf("request env did not override spec env:\n%s", res.Stdout)
	}
}

func testCommandLine(t *testing.T, f Factory) {
	e := newEnv(t, f)
	sb := e.newSandbox()
	argv := f.Commands.Echo("'quoted words'", "x")
	line := strings.Join(argv, " ")
	res := run(t, sb, api.ExecRequest{Command: line})
	if res.ExitCode != 0 || res.Stdout != "quoted words x\n" {
		t.Fatalf("command line %q: %+v", line, res)
	}
}

func testStreams(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	var out, errb bytes.Buffer
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		ExecRequest: api.ExecRequest{Cmd: f.Commands.Echo("streamed"), TimeoutS: 60},
		Stdout:      &out, Stderr: &errb,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec: %v %+v", err, res)
	}
	if out.String() != "streamed\n" {
		t.Errorf("stream got %q", out.String())
	}
	// The caller has the output: it is not repeated in the result.
	if res.Stdout != "" || res.Stderr != "" {
		t.Errorf("streamed output in the result too: %+v", res)
	}
}

func testOutputCap(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	start := time.Now()
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Flood(), MaxOutputBytes: 1000, TimeoutS: 1})
	if len(res.Stdout) != 1000 || !res.StdoutTruncated {
		t.Fatalf("flood: len(stdout)=%d truncated=%v", len(res.Stdout), res.StdoutTruncated)
	}
	if !res.TimedOut || res.ExitCode != -1 {
		t.Errorf("flood should end by its timeout: %+v", res)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("flood took %v to stop", d)
	}
}

func testTimeout(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	start := time.Now()
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Sleep(60), TimeoutS: 0.5})
	if !res.TimedOut || res.ExitCode != -1 || res.Error != "timeout" {
		t.Fatalf("sleep past timeout: %+v, want exit code -1, timed out, error \"timeout\"", res)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("timeout took %v to take effect", d)
	}
	// The sandbox is still usable.
	if res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Echo("after")}); res.Stdout != "after\n" {
		t.Errorf("after timeout: %+v", res)
	}
}

// testExecRawOutput: output is the program's bytes, UTF-8 or not, NUL
// bytes included, on every tier (the API edge then turns what is not
// UTF-8 into U+FFFD, the same for all).
func testExecRawOutput(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	const raw = "\xff\xfe\x00 not UTF-8 \xc3\n"
	write(t, sb.Files(), "raw.bin", raw, sandbox.WriteOptions{})
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.ReadFile("raw.bin")})
	if res.ExitCode != 0 || res.Stdout != raw {
		t.Fatalf("printing raw bytes: %+v; want stdout %q", res, raw)
	}
	var out, errb bytes.Buffer
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		ExecRequest: api.ExecRequest{Cmd: f.Commands.ReadFile("raw.bin"), TimeoutS: 60},
		Stdout:      &out, Stderr: &errb,
	})
	if err != nil || res.ExitCode != 0 || out.String() != raw {
		t.Errorf("streaming raw bytes: %+v, %v; streamed %q, want %q", res, err, out.String(), raw)
	}
}

func testContextCancel(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Sleep(60), TimeoutS: 120}})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("cancelling the context did not stop the command")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("cancel took %v", d)
	}
}

func testMemoryLimit(t *testing.T, f Factory) {
	e := newEnv(t, f)
	spec := e.spec()
	spec.MemoryMB = 64
	sb := e.create(spec)
	if res := run(t, sb, api.ExecRequest{Cmd: f.Commands.AllocMB(8)}); res.ExitCode != 0 {
		t.Fatalf("allocating 8 MiB under a 64 MiB limit failed: %+v", res)
	}
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.AllocMB(512)})
	if res.ExitCode == 0 {
		t.Fatalf("allocating 512 MiB under a 64 MiB limit succeeded: %+v", res)
	}
	// Failing cleanly: the sandbox still works.
	if res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Echo("alive")}); res.Stdout != "alive\n" {
		t.Errorf("after memory failure: %+v", res)
	}
}

func testConcurrentExec(t *testing.T, f Factory) {
	e := newEnv(t, f)
	sbs := []sandbox.Sandbox{e.newSandbox(), e.newSandbox()}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sb := sbs[i%2]
			want := fmt.Sprintf("msg-%d", i)
			res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Cat(), Stdin: want, TimeoutS: 60}})
			if err != nil || res.Stdout != want {
				errs <- fmt.Errorf("call %d: err=%v stdout=%q", i, err, res.Stdout)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testExecBadRequest(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{TimeoutS: 5}})
	if !errors.Is(err, errdefs.Invalid) {
		t.Errorf("empty command: err = %v, want Invalid", err)
	}
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"/no/such/program-xyz"}, TimeoutS: 5}})
	if err == nil && res.ExitCode == 0 {
		t.Errorf("missing program ran: %+v", res)
	}
	if err != nil && !errors.Is(err, errdefs.NotFound) && !errors.Is(err, errdefs.Invalid) {
		t.Errorf("missing program: err = %v, want NotFound, Invalid or a failed result", err)
	}
}

func containsLine(s, line string) bool {
	for _, l := range strings.Split(s, "\n") {
		if l == line {
			return true
		}
	}
	return false
}
