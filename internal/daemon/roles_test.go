package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	info, _ := runRoleStop(t, role, cfg)
	return info
}

// runRoleStop is runRole that also returns a stop function (which the
// test's end calls if the test did not).
func runRoleStop(t *testing.T, role Role, cfg config.Config) (Info, func()) {
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
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := testenv.Recv(t, done, 2*time.Minute, "the role to stop"); err != nil {
				t.Errorf("role: %v", err)
			}
			testenv.NoMountsUnder(t, cfg.DataDir)
		})
	}
	t.Cleanup(stop)
	return info, stop
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

// TestHollowNodes joins `dsec node --hollow 3` to a `dsec up`: three
// simulated nodes register and heartbeat, take creates, execs and
// deletes through the real API and node protocol (execs succeed with no
// output; files are refused with unsupported_on_tier), and leave when
// their process stops, destroying their sandboxes.
func TestHollowNodes(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) { c.NATS.Listen = "127.0.0.1:0" })
	natsToken, _, err := auth.LoadOrCreateAt(filepath.Join(u.dir, "nats.token"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.DataDir, cfg.Node.ID, cfg.LogLevel = t.TempDir(), "fleet", "warn"
	cfg.Node.Hollow = 3
	cfg.NATS.URL, cfg.NATS.Token = u.info.NATSURL, natsToken
	info, stop := runRoleStop(t, RoleNode, cfg)
	if info.NodeID != "fleet-h0001" {
		t.Errorf("the role's node ID %q, want fleet-h0001", info.NodeID)
	}
	ctx := context.Background()
	hollowNodes := func() int {
		nodes, err := u.c.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, nd := range nodes.Nodes {
			if strings.HasPrefix(nd.ID, "fleet-h") {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(15 * time.Second)
	for hollowNodes() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d hollow nodes seen, want 3", hollowNodes())
		}
		time.Sleep(100 * time.Millisecond)
	}
	onHollow := 0
	for range 24 {
		sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(sb.Node, "fleet-h") {
			continue
		}
		onHollow++
		res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Command: "echo hi"})
		if err != nil || res.ExitCode != 0 || res.Stdout != "" {
			t.Errorf("exec in a hollow sandbox: %+v, %v; want exit 0 and no output", res, err)
		}
		_, err = u.c.WriteFile(ctx, sb.ID, "f", strings.NewReader("x"), client.WriteOptions{})
		wantCode(t, "a file write in a hollow sandbox", err, api.CodeUnsupportedOnTier)
		if err := u.c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Errorf("delete of a hollow sandbox: %v", err)
		}
	}
	if onHollow == 0 {
		t.Fatal("no sandbox was placed on a hollow node")
	}
	kept, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierVM, TimeoutS: 600})
	if err != nil || !strings.HasPrefix(kept.Node, "fleet-h") {
		t.Fatalf("a vm sandbox (only hollow nodes offer the tier here?): %+v, %v", kept, err)
	}
	stop()
	deadline = time.Now().Add(30 * time.Second)
	for {
		got, err := u.c.GetSandbox(ctx, kept.ID)
		n := hollowNodes()
		if err == nil && got.State != api.StateRunning && n == 0 {
			t.Logf("after the stop: sandbox %s (%s), no hollow node listed", got.State, got.Reason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the hollow nodes stopped: %d still listed; their sandbox %+v, %v", n, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestClientFailover: a client given two API servers of one DSec (the
// second a `dsec server` on the same NATS, holding the same token) works
// through the first, and when that server stops, its calls go on through
// the other without an error reaching the caller.
func TestClientFailover(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) { c.NATS.Listen = "127.0.0.1:0" })
	natsToken, _, err := auth.LoadOrCreateAt(filepath.Join(u.dir, "nats.token"))
	if err != nil {
		t.Fatal(err)
	}
	token, err := auth.Load(u.dir)
	if err != nil {
		t.Fatal(err)
	}
	srvCfg := config.Defaults()
	srvCfg.DataDir, srvCfg.LogLevel, srvCfg.API.Listen = t.TempDir(), "warn", "127.0.0.1:0"
	srvCfg.NATS.URL, srvCfg.NATS.Token = u.info.NATSURL, natsToken
	// The same token: the servers of one DSec share their users.
	if err := os.WriteFile(filepath.Join(srvCfg.DataDir, auth.TokenFile), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	info, stop := runRoleStop(t, RoleServer, srvCfg)
	c, err := client.New(info.APIURL+","+u.info.APIURL, token)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c.BaseURL() != info.APIURL {
		t.Errorf("client at %s before any failure, want the first server %s", c.BaseURL(), info.APIURL)
	}
	stop()
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "still here"}})
	if err != nil || res.Stdout != "still here\n" {
		t.Fatalf("exec after the first server stopped: %+v, %v", res, err)
	}
	if c.BaseURL() != u.info.APIURL {
		t.Errorf("client at %s after the failover, want %s", c.BaseURL(), u.info.APIURL)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Errorf("delete through the second server: %v", err)
	}
}

// TestCordonAndDrain, on two hollow nodes: a cordoned node gets no new
// sandbox; uncordoned, it does again; a drained node's sandbox recorded
// with resume_on_preempt is resumed on the other node behind its ID, and
// its others are destroyed at the drain's deadline.
func TestCordonAndDrain(t *testing.T) {
	u := startUp(t, "", func(c *config.Config) {
		c.NATS.Listen = "127.0.0.1:0"
		c.VM.Disabled = true // only the hollow nodes take vm sandboxes
	})
	natsToken, _, err := auth.LoadOrCreateAt(filepath.Join(u.dir, "nats.token"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.DataDir, cfg.Node.ID, cfg.LogLevel, cfg.Node.Hollow = t.TempDir(), "pair", "warn", 2
	cfg.NATS.URL, cfg.NATS.Token = u.info.NATSURL, natsToken
	runRole(t, RoleNode, cfg)
	ctx := context.Background()
	a, b := "pair-h0001", "pair-h0002"
	nodeOf := func(id string) api.Node {
		t.Helper()
		l, err := u.c.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range l.Nodes {
			if n.ID == id {
				return n
			}
		}
		return api.Node{}
	}
	deadline := time.Now().Add(15 * time.Second)
	for nodeOf(a).ID == "" || nodeOf(b).ID == "" {
		if time.Now().After(deadline) {
			t.Fatal("the hollow nodes did not show")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := u.c.CordonNode(ctx, "nope"); err == nil {
		t.Error("cordoning an unknown node succeeded")
	}
	if n, err := u.c.CordonNode(ctx, a); err != nil || !n.Cordoned {
		t.Fatalf("cordon: %+v, %v", n, err)
	}
	vm := api.CreateSandboxRequest{Tier: api.TierVM, TimeoutS: 600}
	for range 6 {
		sb, err := u.c.CreateSandbox(ctx, vm)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != b {
			t.Errorf("a sandbox was placed on %s while %s was cordoned", sb.Node, a)
		}
	}
	// A recorded sandbox that may be resumed elsewhere, on b.
	rec := vm
	rec.Trajectory, rec.ResumeOnPreempt = "drain/rollout-1", true
	moving, err := u.c.CreateSandbox(ctx, rec)
	if err != nil || moving.Node != b {
		t.Fatalf("the recorded sandbox: %+v, %v", moving, err)
	}
	if _, err := u.c.Exec(ctx, moving.ID, api.ExecRequest{Command: "make step-1"}); err != nil {
		t.Fatal(err)
	}
	if n, err := u.c.UncordonNode(ctx, a); err != nil || n.Cordoned {
		t.Fatalf("uncordon: %+v, %v", n, err)
	}
	if n, err := u.c.DrainNode(ctx, b, api.DrainRequest{DeadlineS: 2}); err != nil || !n.Draining || !n.Cordoned {
		t.Fatalf("drain: %+v, %v", n, err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		l, err := u.c.ListSandboxes(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		onB, moved := 0, false
		for _, s := range l.Sandboxes {
			if s.Node == b && (s.State == api.StateRunning || s.State == api.StatePending) {
				onB++
			}
			if s.ID == moving.ID && s.Node == a && s.State == api.StateRunning {
				moved = true
			}
		}
		if onB == 0 && moved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s into the drain: %d sandboxes still on %s, the recorded one moved to %s: %v", onB, b, a, moved)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got, err := u.c.GetSandbox(ctx, moving.ID)
	if err != nil || got.Incarnation < 2 {
		t.Errorf("the resumed sandbox: %+v, %v; want a second incarnation", got, err)
	}
	if _, err := u.c.Exec(ctx, moving.ID, api.ExecRequest{Command: "make step-2"}); err != nil {
		t.Errorf("exec in the resumed sandbox, behind its ID: %v", err)
	}
}
