package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestMain lets the test binary double as a `dsec up` process, so that
// crash tests can kill -9 a real daemon.
func TestMain(m *testing.M) {
	if cfgJSON := os.Getenv("DSEC_TEST_DAEMON"); cfgJSON != "" {
		var cfg config.Config
		if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		level := slog.LevelWarn
		if os.Getenv("DSEC_TEST_LOG") == "info" {
			level = slog.LevelInfo
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		// SIGTERM shuts it down as it would `dsec up`; SIGKILL crashes it.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		role := RoleUp
		switch os.Getenv("DSEC_TEST_ROLE") {
		case "node":
			role = RoleNode
		case "server":
			role = RoleServer
		}
		if err := Run(ctx, role, cfg, Build{Version: "test"}, log, func(Info) {}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.SweepStale(30 * time.Minute)
	testenv.SweepDeadTests()
	os.Exit(m.Run())
}

func createN(t *testing.T, c *client.Client, n int, req api.CreateSandboxRequest) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		sb, err := c.CreateSandbox(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(context.Background(), sb.ID, "note.txt", strings.NewReader("note "+sb.ID), client.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	return ids
}

func TestRestartKeepsSandboxes(t *testing.T) {
	dir := t.TempDir()
	keep := func(c *config.Config) { c.KeepSandboxes = true }
	u := startUp(t, dir, keep)
	ids := createN(t, u.c, 5, api.CreateSandboxRequest{})
	short, err := u.c.CreateSandbox(context.Background(), api.CreateSandboxRequest{TimeoutS: 2})
	if err != nil {
		t.Fatal(err)
	}
	u.stop()
	time.Sleep(2500 * time.Millisecond) // the short one expires while we are down

	u = startUp(t, dir, keep)
	ctx := context.Background()
	for _, id := range ids {
		sb, err := u.c.GetSandbox(ctx, id)
		if err != nil || sb.State != api.StateRunning {
			t.Fatalf("after restart %s = %+v, %v", id, sb, err)
		}
		got, err := u.c.ReadFileBytes(ctx, id, "note.txt")
		if err != nil || string(got) != "note "+id {
			t.Errorf("file after restart: %q, %v", got, err)
		}
		if res, err := u.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"cat", "note.txt"}}); err != nil || res.Stdout != "note "+id {
			t.Errorf("exec after restart: %+v, %v", res, err)
		}
	}
	waitState(t, u.c, short.ID, api.StateStopped, 15*time.Second)
	if _, err := os.Stat(u.workspaceDir(short.ID)); !os.IsNotExist(err) {
		t.Errorf("sandbox expired during downtime kept its workspace: %v", err)
	}

	// A shutdown without keep destroys them, and says so.
	u.stop()
	u = startUp(t, dir, nil)
	u.stop()
	u = startUp(t, dir, nil)
	for _, id := range ids {
		sb, err := u.c.GetSandbox(ctx, id)
		if err != nil || sb.State != api.StateStopped || sb.Reason != "shutdown" {
			t.Errorf("after a destroying shutdown %s = %+v, %v", id, sb, err)
		}
	}
	// No workspace is mounted any more (the state tmpfs of the running
	// node is; the harness checks it goes at shutdown).
	for _, m := range testenv.Mounts(t, dir) {
		if strings.Contains(m, "/workspace") {
			t.Errorf("workspace still mounted: %s", m)
		}
	}
}

func TestRestartDuringWorkloadLosesNothing(t *testing.T) {
	dir := t.TempDir()
	keep := func(c *config.Config) { c.KeepSandboxes = true }
	u := startUp(t, dir, keep)
	var (
		mu      sync.Mutex
		created []string
		wg      sync.WaitGroup
	)
	ctx, stopLoad := context.WithCancel(context.Background())
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
				if err != nil {
					return // the server went away
				}
				mu.Lock()
				created = append(created, sb.ID)
				mu.Unlock()
				_, _ = u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "x"}})
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	u.stop() // in the middle of the workload
	stopLoad()
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the workload's clients")
	if len(created) == 0 {
		t.Fatal("the workload created nothing")
	}

	u = startUp(t, dir, nil)
	bg := context.Background()
	for _, id := range created {
		sb, err := u.c.GetSandbox(bg, id)
		if err != nil {
			t.Fatalf("record of %s lost across restart: %v", id, err)
		}
		if sb.State != api.StateRunning {
			t.Errorf("%s = %s (%s), want running", id, sb.State, sb.Reason)
			continue
		}
		if res, err := u.c.Exec(bg, id, api.ExecRequest{Cmd: []string{"echo", "alive"}}); err != nil || res.Stdout != "alive\n" {
			t.Errorf("exec in %s after restart: %+v, %v", id, res, err)
		}
	}
	t.Logf("%d sandboxes created before the restart, all accounted for", len(created))
}

func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Defaults()
	cfg.DataDir, cfg.API.Listen, cfg.NATS.Listen, cfg.Node.ID = dir, "127.0.0.1:0", "none", "test-node"
	cfg.Container.Disabled = true
	cfg.MicroVM.Disabled = true
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DSEC_TEST_DAEMON="+string(raw))
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			testenv.Recv(t, exited, time.Minute, "the daemon to exit after SIGKILL")
		}
	}()
	addr, ok := waitFile(filepath.Join(dir, AddrFile), 2*time.Minute, exited)
	if !ok {
		t.Fatalf("the daemon did not start; its log:\n%s", logs.String())
	}
	tok, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New("http://"+addr, tok)
	if err != nil {
		t.Fatal(err)
	}
	sub := &up{t: t, c: c}
	sub.waitHealthy()
	ids := createN(t, c, 8, api.CreateSandboxRequest{})

	// kill -9 while creates are in flight.
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
				if err != nil {
					return // the daemon is dead
				}
				mu.Lock()
				ids = append(ids, sb.ID)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, exited, time.Minute, "the daemon to exit after SIGKILL")
	killed = true
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the clients to see the daemon gone")
	t.Logf("%d sandboxes acknowledged before the kill", len(ids))

	u := startUp(t, dir, nil)
	ctx := context.Background()
	for _, id := range ids {
		sb, err := u.c.GetSandbox(ctx, id)
		if err != nil {
			t.Fatalf("record of %s lost in the crash: %v", id, err)
		}
		if sb.State != api.StateRunning {
			t.Errorf("%s = %s (%s) after crash, want running (re-adopted)", id, sb.State, sb.Reason)
		}
	}
	// Records the crash left pending are failed, and nothing stays on the
	// node without a live record.
	all, err := u.c.ListAllSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		switch sb.State {
		case api.StatePending:
			waitState(t, u.c, sb.ID, api.StateFailed, 15*time.Second)
		case api.StateStopping:
			waitState(t, u.c, sb.ID, api.StateStopped, 30*time.Second)
		}
	}
	u.stop()
	testenv.NoMountsUnder(t, dir)
	if t.Failed() {
		t.Logf("crashed daemon's log:\n%s", logs.String())
	}
}

// waitFile waits for a non-empty file, giving up after d or when quit
// closes.
func waitFile(path string, d time.Duration, quit <-chan struct{}) (string, bool) {
	deadline := time.Now().Add(d)
	for {
		select {
		case <-quit:
			return "", false
		default:
		}
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			return strings.TrimSpace(string(b)), true
		}
		if time.Now().After(deadline) {
			return "", false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitState(t *testing.T, c *client.Client, id string, want api.State, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		sb, err := c.GetSandbox(context.Background(), id)
		if err == nil && sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: state %+v, %v; want %s", id, sb, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
