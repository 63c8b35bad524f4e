package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// builtinCache is shared by every daemon of a test run.
var builtinCache = filepath.Join(os.TempDir(), "dsec-test-builtin")

// wasmCache is the compiled-module cache every daemon of a test run
// shares: compiling the tools under the race detector on a loaded
// machine takes tens of seconds, which a test would otherwise pay per
// daemon.
var wasmCache = filepath.Join(os.TempDir(), "dsec-test-wasm")

// readyWait bounds startUp's wait for the daemon to be ready.
var readyWait = 2 * time.Minute

// up is a `dsec up` running in this test process on a temporary data
// directory, with a client for its API.
type up struct {
	t      testing.TB
	dir    string
	cfg    config.Config
	info   Info
	c      *client.Client
	cancel context.CancelFunc
	done   chan error
	// log holds what the daemon logged (warnings and errors).
	log *logLines
}

// startUp runs `dsec up` in dir (a fresh temp dir if empty) with the
// test's adjustments to the configuration.
func startUp(t testing.TB, dir string, adjust func(*config.Config)) *up {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cfg := config.Defaults()
	cfg.DataDir = dir
	cfg.API.Listen = "127.0.0.1:0"
	cfg.NATS.Listen = "none"
	cfg.Node.ID = "test-node"
	cfg.LogLevel = "warn"
	// Built-in layers are built once per test binary, not per daemon; the
	// slow debian-12 has tests of its own.
	cfg.Images.BuiltinCache = builtinCache
	cfg.Images.SkipSlow = true
	cfg.Node.FunctionCacheDir = wasmCache
	// The container tier is on only in the tests that use it
	// (withContainers): it keeps a pool of network namespaces.
	cfg.Container.Disabled = true
	// So is the microvm tier (withMicroVM): it fetches the guest kernel
	// in the background.
	cfg.MicroVM.Disabled = true
	if adjust != nil {
		adjust(&cfg)
	}
	goroutines := testenv.Goroutines()
	u := &up{t: t, dir: dir, cfg: cfg, done: make(chan error, 1), log: &logLines{}}
	ctx, cancel := context.WithCancel(context.Background())
	u.cancel = cancel
	ready := make(chan Info, 1)
	log := slog.New(slog.NewTextHandler(testWriter{t, u.log}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		u.done <- Run(ctx, RoleUp, cfg, Build{Version: "test"}, log, func(i Info) { ready <- i })
	}()
	select {
	case u.info = <-ready:
	case err := <-u.done:
		t.Fatalf("dsec up exited: %v", err)
	case <-time.After(readyWait):
		// Stop what started, so that the failure leaks nothing.
		cancel()
		select {
		case <-u.done:
		case <-time.After(2 * time.Minute):
			t.Error("dsec up did not stop after it failed to become ready")
		}
		t.Fatalf("dsec up did not become ready within %v", readyWait)
	}
	tok, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Raw answers: the tests look at 429s and 503s themselves.
	if u.c, err = client.New(u.info.APIURL, tok, client.WithRetry(0)); err != nil {
		t.Fatal(err)
	}
	u.waitHealthy()
	t.Cleanup(func() {
		u.stop()
		if cfg.KeepSandboxes {
			// Mounts outlive a keeping shutdown by design; a later start
			// in the test normally takes them over. If the test ended
			// first, clear them so one failure does not leak into others.
			if t.Failed() {
				testenv.UnmountAll(dir)
			}
			return
		}
		testenv.NoMountsUnder(t, dir)
		u.c.CloseIdleConnections()
		// Everything the daemon started has stopped with it.
		testenv.GoroutinesSettle(t, goroutines)
	})
	return u
}

func (u *up) waitHealthy() {
	u.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := u.c.Health(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("not healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop shuts the daemon down and waits; it is idempotent.
func (u *up) stop() {
	if u.cancel == nil {
		return
	}
	u.cancel()
	u.cancel = nil
	select {
	case err := <-u.done:
		if err != nil {
			u.t.Errorf("dsec up: %v", err)
		}
	case <-time.After(2 * time.Minute):
		u.t.Error("dsec up did not stop")
	}
}

// testWriter sends daemon logs to the test log and, if lines is not
// nil, keeps them there.
type testWriter struct {
	t     testing.TB
	lines *logLines
}

func (w testWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	w.t.Log(line)
	if w.lines != nil {
		w.lines.add(line)
	}
	return len(p), nil
}

// logLines are a daemon's log lines. It is safe for concurrent use.
type logLines struct {
	mu    sync.Mutex // guards following fields
	lines []string
}

func (l *logLines) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

// matching returns the lines that contain s.
func (l *logLines) matching(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// workspaceDir is where the function tier keeps a sandbox's workspace.
func (u *up) workspaceDir(id string) string {
	return filepath.Join(u.dir, "node", "function", "sandboxes", id, "workspace")
}

func isClass(err error, target error) bool { return errors.Is(err, target) }
