package function

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestTools(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	if _, err := sb.Files().Write(context.Background(), "/workspace/sub/f.txt", strings.NewReader("a b\nc\n"), sandbox.WriteOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		argv       []string
		stdin, cwd string
		want       string
		code       int
	}{
		{name: "echo -n", argv: []string{"echo", "-n", "a", "b"}, want: "a b"},
		{name: "wc stdin", argv: []string{"wc"}, stdin: "one two\nthree\n", want: "      2       3      14\n"},
		{name: "wc -l", argv: []string{"wc", "-l"}, stdin: "a\nb\n", want: "2\n"},
		{name: "wc file", argv: []string{"wc", "/workspace/sub/f.txt"}, want: "2 3 6 /workspace/sub/f.txt\n"},
		{name: "calc args", argv: []string{"calc", "2", "*", "(3+4)", "^", "2"}, want: "98\n"},
		{name: "calc stdin", argv: []string{"calc"}, stdin: "10 / 4", want: "2.5\n"},
		{name: "calc error", argv: []string{"calc", "1/0"}, code: 2},
		{name: "json path", argv: []string{"json", ".a.b[1]"}, stdin: `{"a":{"b":[1,{"c":true}]}}`, want: "{\n  \"c\": true\n}\n"},
		{name: "json compact", argv: []string{"json", "-c"}, stdin: `{ "b": [1, 2], "a": "x" }`, want: `{"a":"x","b":[1,2]}` + "\n"},
		{name: "json invalid", argv: []string{"json"}, stdin: `{"a":`, code: 1},
		{name: "sha256sum", argv: []string{"sha256sum"}, stdin: "abc", want: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  -\n"},
		{name: "ls relative to cwd", argv: []string{"ls"}, cwd: "/workspace/sub", want: "f.txt\n"},
		{name: "ls image bin", argv: []string{"ls", "/bin"}, want: "alloc.wasm\n"},
		{name: "cat file relative", argv: []string{"cat", "sub/f.txt"}, want: "a b\nc\n"},
		{name: "exit code", argv: []string{"exit", "7"}, code: 7},
		{name: "explicit image path", argv: []string{"/bin/echo.wasm", "x"}, want: "x\n"},
		{name: "tiny echo", argv: []string{"tiny-echo"}, stdin: strings.Repeat("z", 100000), want: strings.Repeat("z", 100000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: tt.argv, Stdin: tt.stdin, Cwd: tt.cwd, TimeoutS: 30}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.code {
				t.Fatalf("exit code %d, want %d: %+v", res.ExitCode, tt.code, res)
			}
			if tt.name == "ls image bin" {
				if !strings.HasPrefix(res.Stdout, tt.want) {
					t.Errorf("stdout %q, want prefix %q", res.Stdout, tt.want)
				}
				return
			}
			if tt.code == 0 && res.Stdout != tt.want {
				t.Errorf("stdout %q, want %q", res.Stdout, tt.want)
			}
		})
	}
}

func TestEnvAndArgv0(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, func(s *sandbox.Spec) { s.Env = map[string]string{"A": "spec"} })
	if _, err := sb.Files().Mkdir(context.Background(), "sub", false); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		Cmd: []string{"env"}, Env: map[string]string{"B": "req"}, Cwd: "sub", TimeoutS: 30,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "A=spec\nB=req\nPWD=/workspace/sub\n"; res.Stdout != want {
		t.Errorf("env = %q, want %q", res.Stdout, want)
	}
	_, err = sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"env"}, Env: map[string]string{"A=B": "x"}}})
	if !errors.Is(err, errdefs.Invalid) {
		t.Errorf("bad env name: err = %v, want Invalid", err)
	}
}

func TestFreshInstancePerCall(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	counter := installTool(t, sb, "counter")
	// The first calls fill the pool; later ones reuse the memory regions of
	// earlier instances, both released (32 MiB dirty) and cleared (small).
	for i := 0; i < 6; i++ {
		for _, arg := range []string{"big", "small"} {
			res := run(t, sb, "", counter, arg)
			if res.ExitCode != 0 || res.Stdout != "1\n" {
				t.Fatalf("call %d (%s): %+v", i, arg, res)
			}
		}
	}
}

func TestTrap(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	res := run(t, sb, "", "trap")
	if res.ExitCode != -1 || !strings.HasPrefix(res.Error, "wasm trap: unreachable") || res.TimedOut {
		t.Fatalf("trap: %+v", res)
	}
	if res := run(t, sb, "", "echo", "ok"); res.Stdout != "ok\n" {
		t.Errorf("after a trap: %+v", res)
	}
}

func TestLoopTimeout(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{PoolSize: -1})
	sb := create(t, rt, nil)
	run(t, sb, "", "echo", "warm") // start any lazily started goroutines
	before := runtime.NumGoroutine()
	start := time.Now()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"loop"}, TimeoutS: 0.2}})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("loop ran %v past a 0.2 s timeout", d)
	}
	if !res.TimedOut || res.ExitCode != -1 || res.Error != "timeout" {
		t.Errorf("loop: %+v", res)
	}
	waitGoroutines(t, before)
}

// waitGoroutines waits for the goroutine count to come back to n.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMemoryLimit(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 64 })
	run(t, sb, "", "echo", "warm")
	rss := vmRSS(t)
	res := run(t, sb, "", "alloc", "512")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "out of memory") {
		t.Fatalf("alloc 512 MiB under 64 MiB: %+v", res)
	}
	if grew := vmRSS(t) - rss; grew > 100<<20 {
		t.Errorf("resident memory grew by %d MiB", grew>>20)
	}
	if res := run(t, sb, "", "alloc", "16"); res.ExitCode != 0 {
		t.Errorf("alloc 16 MiB after the failure: %+v", res)
	}
	if st, err := sb.Stats(context.Background()); err != nil || st.MemoryBytes != 0 {
		t.Errorf("idle Stats = %+v, %v; want MemoryBytes 0", st, err)
	}

	// A module whose initial memory is past the limit does not start.
	tight := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 1 })
	_, err := tight.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo", "x"}}})
	if !errors.Is(err, errdefs.TooLarge) || errdefs.CodeOf(err) != "memory_limit" {
		t.Errorf("echo under 1 MiB: err = %v, want TooLarge memory_limit", err)
	}
	if res := run(t, tight, "in", "tiny-echo"); res.Stdout != "in" {
		t.Errorf("tiny-echo (one page) under 1 MiB: %+v", res)
	}
}

func TestOutputCap(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	var streamed strings.Builder
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		ExecRequest: api.ExecRequest{Cmd: []string{"yes", "abc"}, MaxOutputBytes: 10, TimeoutS: 0.3},
		Stdout:      &streamed,
	})
	if err != nil {
		t.Fatal(err)
	}
	if streamed.String() != "abc\nabc\nab" || !res.StdoutTruncated || !res.TimedOut || res.Stdout != "" {
		t.Errorf("yes: %+v, streamed %q", res, streamed.String())
	}
}

func TestStdinStreamStopsAtTimeout(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	run(t, sb, "", "echo", "warm")
	before := runtime.NumGoroutine()
	pr, pw := io.Pipe()
	go pw.Write([]byte("partial "))
	start := time.Now()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		ExecRequest: api.ExecRequest{Cmd: []string{"cat"}, TimeoutS: 0.3},
		Stdin:       pr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cat blocked on stdin for %v", d)
	}
	if !res.TimedOut || res.Stdout != "partial " {
		t.Errorf("cat of an open stream: %+v", res)
	}
	pw.Close() // the reader's owner closes it; the pump then exits
	waitGoroutines(t, before)
}

func TestContextCancel(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "30"}}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want one wrapping context.DeadlineExceeded", err)
	}
}

func TestToolNotFound(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	for _, argv := range [][]string{{"nope"}, {"/bin/nope.wasm"}, {"/workspace/nope.wasm"}, {"/etc/passwd"}} {
		_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: argv}})
		if !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != "tool_not_found" {
			t.Errorf("%q: err = %v, want NotFound tool_not_found", argv, err)
			continue
		}
		if msg := errdefs.MessageOf(err); !strings.Contains(msg, argv[0]) || !strings.Contains(msg, "function-default") {
			t.Errorf("%q: message %q should name the tool and the image", argv, msg)
		}
	}
	if _, err := sb.Files().Write(context.Background(), "/workspace/bad.wasm", strings.NewReader("not wasm"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"/workspace/bad.wasm"}}})
	if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != "invalid_module" {
		t.Errorf("invalid module: err = %v, want Invalid invalid_module", err)
	}
}

func TestWorkspaceModuleChanges(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	p := installTool(t, sb, "tool")
	if res := run(t, sb, "", p, "-n", "x"); res.Stdout != "" || res.ExitCode != 127 {
		t.Fatalf("dsectools as tool.wasm: %+v", res) // unknown tool name
	}
	// Replacing the file with another module takes effect at once.
	tiny, err := sb.img.root.ReadFile("bin/tiny-echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files().Write(context.Background(), p, strings.NewReader(string(tiny)), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if res := run(t, sb, "now tiny", p); res.Stdout != "now tiny" {
		t.Errorf("after replacing the module: %+v", res)
	}
}

func TestProcessesUnsupported(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	_, err := sb.StartProcess(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"cat"}}})
	if !errors.Is(err, errdefs.Unsupported) || !strings.Contains(err.Error(), "function") {
		t.Errorf("StartProcess: err = %v, want Unsupported naming the tier", err)
	}
	if _, err := sb.Process(1); !errors.Is(err, errdefs.Unsupported) {
		t.Errorf("Process: err = %v", err)
	}
	if caps := rt.Capabilities(); caps.Shell || caps.Processes || caps.PTY || caps.FileRoot != "/workspace" {
		t.Errorf("Capabilities = %+v", caps)
	}
	_, err = sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Command: "echo a | cat"}})
	if !errors.Is(err, errdefs.Unsupported) {
		t.Errorf("shell syntax: err = %v, want Unsupported", err)
	}
}

func TestMaxCalls(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{MaxCalls: 1})
	sb := create(t, rt, nil)
	busy := make(chan error, 1)
	go func() {
		_, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "1"}}})
		busy <- err
	}()
	waitFor(t, "the first call to run", func() bool { return sb.running.Load() == 1 })
	// The second call waits for the slot; its timeout starts once it runs.
	start := time.Now()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo", "second"}, TimeoutS: 0.5}})
	if err != nil || res.Stdout != "second\n" || time.Since(start) < 500*time.Millisecond {
		t.Errorf("second call: %+v, %v after %v", res, err, time.Since(start))
	}
	if err := testenv.Recv(t, busy, time.Minute, "the busy call to end"); err != nil {
		t.Fatal(err)
	}
	// A caller that gives up while waiting gets its context's error.
	go sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "1"}}})
	waitFor(t, "the blocking call to run", func() bool { return sb.running.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"echo"}}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting call: err = %v, want DeadlineExceeded", err)
	}
}
