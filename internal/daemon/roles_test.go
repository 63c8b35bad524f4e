package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// runRole runs a server or node role in this process until the test ends.
func runRole(t *testing.T, role Role, cfg config.Config) Info {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan Info, 1)
	log := slog.New(slog.NewTextHandler(testWriter{t, nil}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { done <- Run(ctx, role, cfg, Build{Version: "test"}, log, func(i Info) { ready <- i }) }()
	var info Info
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("role exited: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("role did not start")
	}
	t.Cleanup(func() {
		cancel()
		if err := testenv.Recv(t, done, 2*time.Minute, "the role to stop"); err != nil {
			t.Errorf("role: %v", err)
		}
		testenv.NoMountsUnder(t, cfg.DataDir)
	})
	return info
}

// TestNodeAndServerRoles joins a second node and a second API server to a
// `dsec up` through its NATS listener: the code path of a cluster.
func TestNodeAndServerRoles(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) { c.NATS.Listen = "127.0.0.1:0" })
	natsToken, _, err := auth.LoadOrCreateAt(filepath.Join(u.dir, "nats.token"))
	if err != nil || u.info.NATSURL == "" {
		t.Fatalf("NATS URL %q, token: %v", u.info.NATSURL, err)
	}

	nodeCfg := config.Defaults()
	nodeCfg.DataDir, nodeCfg.Node.ID, nodeCfg.LogLevel = t.TempDir(), "node-b", "warn"
	nodeCfg.Container.Disabled = true
	nodeCfg.MicroVM.Disabled = true
	nodeCfg.NATS.URL, nodeCfg.NATS.Token = u.info.NATSURL, natsToken
	runRole(t, RoleNode, nodeCfg)

	ctx := context.Background()
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := u.c.Nodes(ctx)
		if err == nil && len(nodes.Nodes) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second node not seen: %+v, %v", nodes, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	placed := map[string]int{}
	for i := 0; i < 10; i++ {
		sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		placed[sb.Node]++
		res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", sb.Node}})
		if err != nil || res.Stdout != sb.Node+"\n" {
			t.Errorf("exec on %s: %+v, %v", sb.Node, res, err)
		}
	}
	if placed["test-node"] == 0 || placed["node-b"] == 0 {
		t.Errorf("placement did not spread: %v", placed)
	}

	// A second API server over the same state sees the same sandboxes.
	srvCfg := config.Defaults()
	srvCfg.DataDir, srvCfg.LogLevel, srvCfg.API.Listen = t.TempDir(), "warn", "127.0.0.1:0"
	srvCfg.NATS.URL, srvCfg.NATS.Token = u.info.NATSURL, natsToken
	info := runRole(t, RoleServer, srvCfg)
	tok, err := auth.Load(srvCfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := client.New(info.APIURL, tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Health(ctx); err != nil {
		t.Errorf("second server health: %v", err)
	}
	// Its token is its own: it does not see the first token's sandboxes.
	l, err := c2.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(l.Sandboxes) != 0 {
		t.Errorf("second server, other token: %+v, %v", l, err)
	}
	n, err := c2.Nodes(ctx)
	if err != nil || len(n.Nodes) != 2 {
		t.Errorf("second server's nodes: %+v, %v", n, err)
	}
}
