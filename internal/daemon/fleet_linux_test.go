package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/natsbus"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// fleet is several `dsec server`s, each with an embedded member of one
// NATS cluster, and `dsec node`s dialling all members: every one a
// process of its own (this test binary, see TestMain), so that a test
// can kill -9 any of them.
type fleet struct {
	t        *testing.T
	token    string // the API token every server shares
	natsTok  string
	servers  []*procDaemon
	scfg     []config.Config
	nodes    []*procDaemon
	ncfg     []config.Config
	natsURLs string
	apiURLs  string
}

func startFleet(t *testing.T, servers, nodes int) *fleet {
	t.Helper()
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, token: tok, natsTok: "fleet-nats-token"}
	// The built-in layers are built here once: the servers, starting
	// together, then only read them from the cache.
	for _, spec := range builtin.Specs("test") {
		if !spec.Slow {
			if _, err := builtin.Ensure(context.Background(), builtinCache, spec, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
		}
	}
	routes := make([]string, servers)
	var natsURLs, apiURLs []string
	for i := range servers {
		routes[i] = testenv.FreeAddr(t)
	}
	for i := range servers {
		cfg := config.Defaults()
		cfg.DataDir = shortTempDir(t)
		cfg.LogLevel = "warn"
		cfg.API.Listen = testenv.FreeAddr(t)
		cfg.NATS.Listen = testenv.FreeAddr(t)
		cfg.NATS.Token = f.natsTok
		cfg.NATS.ServerName = fmt.Sprintf("s%d", i+1)
		cfg.NATS.ClusterName = "fleet"
		cfg.NATS.ClusterListen = routes[i]
		cfg.NATS.Routes = routes
		cfg.Images.BuiltinCache = builtinCache
		cfg.Images.SkipSlow = true
		cfg.Limits.NodeLost = config.Duration{Duration: 20 * time.Second}
		// The servers share one API token, as an operator installs it.
		if err := os.WriteFile(filepath.Join(cfg.DataDir, auth.TokenFile), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		f.scfg = append(f.scfg, cfg)
		natsURLs = append(natsURLs, "nats://"+cfg.NATS.Listen)
		apiURLs = append(apiURLs, "http://"+cfg.API.Listen)
	}
	f.natsURLs, f.apiURLs = strings.Join(natsURLs, ","), strings.Join(apiURLs, ",")
	// The members start together: JetStream serves once a majority is up.
	f.servers = make([]*procDaemon, servers)
	for i := range servers {
		f.servers[i] = launchProcDaemon(t, f.scfg[i], "DSEC_TEST_ROLE=server")
	}
	launched := time.Now()
	for i := range servers {
		f.waitServer(i)
	}
	t.Logf("servers serving %v after their launch", time.Since(launched).Round(time.Millisecond))
	if os.Getenv("DSEC_TEST_LOG") == "info" {
		t.Logf("server 1's log:\n%s", f.servers[0].logs.tail(64<<10))
	}
	for j := range nodes {
		cfg := config.Defaults()
		cfg.DataDir = shortTempDir(t)
		cfg.LogLevel = "warn"
		cfg.Node.ID = fmt.Sprintf("fleet-node-%d", j+1)
		cfg.Node.FunctionCacheDir = wasmCache
		cfg.NATS.URL, cfg.NATS.Token = f.natsURLs, f.natsTok
		cfg.Container.Disabled = true
		cfg.MicroVM.Disabled = true
		f.ncfg = append(f.ncfg, cfg)
		f.nodes = append(f.nodes, launchProcDaemon(t, cfg, "DSEC_TEST_ROLE=node"))
	}
	t.Cleanup(f.stop)
	c := f.client()
	testenv.Eventually(t, 2*time.Minute, "every node to report to the servers", func() bool {
		ns, err := c.Nodes(context.Background())
		return err == nil && len(ns.Nodes) == nodes
	})
	return f
}

// stop stops the nodes, then the servers together (one by one, the last
// ones would wait for a quorum that is gone).
func (f *fleet) stop() {
	began := time.Now()
	var wg sync.WaitGroup
	for _, group := range [][]*procDaemon{f.nodes, f.servers} {
		for _, d := range group {
			select {
			case <-d.exited:
				continue
			default:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.stop()
			}()
		}
		testenv.WaitGroup(f.t, &wg, 5*time.Minute, "the fleet to stop")
	}
	f.t.Logf("fleet stopped in %v", time.Since(began).Round(time.Millisecond))
}

// waitServer waits until server i serves its API.
func (f *fleet) waitServer(i int) {
	f.t.Helper()
	d := f.servers[i]
	if _, ok := waitFile(filepath.Join(f.scfg[i].DataDir, AddrFile), 3*time.Minute, d.exited); !ok {
		f.t.Fatalf("server %d did not start; its log:\n%s", i+1, d.logs.tail(16<<10))
	}
}

// client is a client of every server, failing over between them.
func (f *fleet) client() *client.Client {
	f.t.Helper()
	c, err := client.New(f.apiURLs, f.token)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fleet) restartServer(i int) {
	f.t.Helper()
	began := time.Now()
	f.servers[i] = launchProcDaemon(f.t, f.scfg[i], "DSEC_TEST_ROLE=server")
	f.waitServer(i)
	f.t.Logf("server %d serves again %v after its restart", i+1, time.Since(began).Round(time.Millisecond))
}

func (f *fleet) restartNode(j int) {
	f.t.Helper()
	f.nodes[j] = launchProcDaemon(f.t, f.ncfg[j], "DSEC_TEST_ROLE=node")
}

// loadStats is what a load's clients saw.
type loadStats struct {
	mu       sync.Mutex // guards following fields
	acked    []string   // sandboxes whose create was answered with an ID
	deleted  map[string]bool
	execs    int
	badErrs  []string // errors a client should never see
	retryErr map[string]int
	lostIDs  map[string]string // sandboxes whose node died under a command
}

func (s *loadStats) bad(what string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.badErrs = append(s.badErrs, what+": "+err.Error())
}

func (s *loadStats) retryable(op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var e *client.Error
	code := "transport"
	if errors.As(err, &e) {
		code = e.Code
	}
	s.retryErr[op+" "+code]++
}

// lost records a sandbox whose command failed because its node died: it
// must not be running afterwards.
func (s *loadStats) lost(id, op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lostIDs[id] = op + ": " + err.Error()
}

// retryableErr: an error a client may see while a server or node dies
// and is retried later: the server unreachable, or 503 / 429.
func retryableErr(err error) bool {
	var e *client.Error
	if !errors.As(err, &e) {
		return true // the connection failed: no answer at all
	}
	return e.Class == api.ClassUnavailable || e.Class == api.ClassRateLimited
}

// runLoad creates sandboxes with request IDs, runs a command in each and
// deletes three of four, with workers clients, until ctx ends.
func (f *fleet) runLoad(ctx context.Context, workers int) (*loadStats, func()) {
	s := &loadStats{deleted: map[string]bool{}, retryErr: map[string]int{}, lostIDs: map[string]string{}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := f.client()
			defer c.CloseIdleConnections()
			for i := 0; ctx.Err() == nil; i++ {
				rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				sb, err := c.CreateSandbox(rctx, api.CreateSandboxRequest{Tier: api.TierFunction,
					RequestID: fmt.Sprintf("fleet-%d-%d", w, i), Labels: map[string]string{"load": "fleet"}})
				cancel()
				if err != nil {
					if retryableErr(err) {
						s.retryable("create", err)
					} else {
						s.bad("create", err)
					}
					continue
				}
				s.mu.Lock()
				s.acked = append(s.acked, sb.ID)
				s.mu.Unlock()
				rctx, cancel = context.WithTimeout(context.Background(), time.Minute)
				res, err := c.Exec(rctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "ok"}})
				cancel()
				switch {
				case err == nil && res.Stdout != "ok\n":
					// The node died during the command: it has no
					// answer of its own (the sandbox must end, below).
					s.lost(sb.ID, "exec", fmt.Errorf("exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr))
				case err == nil:
					s.mu.Lock()
					s.execs++
					s.mu.Unlock()
				case retryableErr(err):
					s.retryable("exec", err)
				case client.IsConflict(err) || client.IsNotFound(err):
					// A sandbox whose node was killed has ended (409),
					// or its node, restarted, no longer has it (404).
					s.lost(sb.ID, "exec", err)
				default:
					s.bad("exec", err)
				}
				if i%4 == 0 {
					continue // kept: a quarter stays running
				}
				rctx, cancel = context.WithTimeout(context.Background(), time.Minute)
				err = c.DeleteSandbox(rctx, sb.ID)
				cancel()
				if err == nil || client.IsNotFound(err) {
					s.mu.Lock()
					s.deleted[sb.ID] = true
					s.mu.Unlock()
				} else if retryableErr(err) {
					s.retryable("delete", err)
				} else {
					s.bad("delete", err)
				}
			}
		}()
	}
	return s, func() { testenv.WaitGroup(f.t, &wg, 3*time.Minute, "the load's clients") }
}

// holders lists, for every sandbox the nodes run, the nodes that run it
// (one, unless it exists twice), asking each node over NATS.
func (f *fleet) holders(ctx context.Context) (map[string][]string, error) {
	nc, err := natsbus.Dial(ctx, f.natsURLs, f.natsTok, "fleet-test")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nodes := noderpc.NewClient(nc)
	held := map[string][]string{}
	for _, cfg := range f.ncfg {
		have, err := nodes.List(ctx, cfg.Node.ID)
		if err != nil {
			return nil, fmt.Errorf("listing node %s: %w", cfg.Node.ID, err)
		}
		for _, sb := range have {
			held[sb.ID] = append(held[sb.ID], cfg.Node.ID)
		}
	}
	return held, nil
}

// running lists the load's sandboxes whose records say running.
func (f *fleet) running(ctx context.Context) ([]api.Sandbox, error) {
	return f.client().ListAllSandboxes(ctx, client.ListOptions{Labels: map[string]string{"load": "fleet"}, State: "running"})
}

// mismatches counts the running records whose node does not hold them
// and the sandboxes nodes hold without a running record.
func (f *fleet) mismatches() int {
	ctx := context.Background()
	held, err := f.holders(ctx)
	if err != nil {
		return -1
	}
	list, err := f.running(ctx)
	if err != nil {
		return -1
	}
	n := 0
	for _, sb := range list {
		if !slices.Equal(held[sb.ID], []string{sb.Node}) {
			n++
		}
		delete(held, sb.ID)
	}
	return n + len(held)
}

// checkAccounts checks that every acknowledged sandbox is accounted for:
// running on the node its record names (and that node holds it once),
// or ended with a reason; and that no node runs a sandbox without a live
// record for that node.
func (f *fleet) checkAccounts(s *loadStats) {
	t := f.t
	t.Helper()
	c := f.client()
	ctx := context.Background()
	holders, err := f.holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{} // sandbox → node
	for id, ns := range holders {
		if len(ns) > 1 {
			t.Errorf("sandbox %s runs on %v", id, ns)
		}
		held[id] = ns[0]
	}
	seen := map[string]bool{}
	var running, ended int
	for _, id := range s.acked {
		if seen[id] {
			t.Errorf("sandbox %s was acknowledged twice", id)
		}
		seen[id] = true
		sb, err := c.GetSandbox(ctx, id)
		if client.IsNotFound(err) && s.deleted[id] {
			continue
		}
		if err != nil {
			t.Errorf("acknowledged sandbox %s: %v", id, err)
			continue
		}
		switch sb.State {
		case api.StateRunning:
			running++
			if why, ok := s.lostIDs[id]; ok {
				t.Errorf("sandbox %s is running, but a command in it failed as if its node had died: %s", id, why)
			}
			if held[id] != sb.Node {
				t.Errorf("sandbox %s is running on %s by its record, but that node does not hold it (held by %q)", id, sb.Node, held[id])
			}
		case api.StateStopped, api.StateFailed:
			ended++
			if sb.State == api.StateFailed && sb.Reason == "" {
				t.Errorf("sandbox %s failed without a reason", id)
			}
		default:
			t.Errorf("acknowledged sandbox %s is %s after the faults", id, sb.State)
		}
	}
	list, err := f.running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		delete(held, sb.ID)
	}
	for id, n := range held {
		t.Errorf("node %s runs sandbox %s, which has no running record", n, id)
	}
	t.Logf("acknowledged %d sandboxes: %d running, %d ended, %d deleted; %d commands ran, %d lost with their node; retryable errors %v",
		len(s.acked), running, ended, len(s.deleted), s.execs, len(s.lostIDs), s.retryErr)
	for _, e := range s.badErrs {
		t.Errorf("a client saw a non-retryable error: %s", e)
	}
}

// TestFleetSurvivesFaults: three servers (each an API server and a NATS
// cluster member) and two nodes under a load of creates, commands and
// deletes through clients that know every server. One server is killed
// (-9) and restarted, then one node. Afterwards every acknowledged
// sandbox is accounted for and the clients saw only retryable errors.
// Then the quorum is lost and comes back (checkQuorumLoss).
func TestFleetSurvivesFaults(t *testing.T) {
	began := time.Now()
	f := startFleet(t, 3, 2)
	t.Logf("fleet up in %v", time.Since(began).Round(time.Millisecond))
	ctx, stop := context.WithCancel(context.Background())
	stats, wait := f.runLoad(ctx, 6)
	pause := func(d time.Duration) { time.Sleep(d) }

	pause(3 * time.Second)
	f.servers[0].kill()
	pause(5 * time.Second)
	f.restartServer(0)
	pause(3 * time.Second)
	f.nodes[0].kill()
	pause(3 * time.Second)
	f.restartNode(0)
	pause(5 * time.Second)
	stop()
	wait()
	if len(stats.acked) < 20 {
		t.Fatalf("only %d creates were acknowledged under the faults", len(stats.acked))
	}
	// The leader reconciles within seconds: the records of sandboxes the
	// restarted node lost end, and the killed server's creates are
	// completed or undone.
	settle := time.Now()
	testenv.Eventually(t, 2*time.Minute, "records and nodes to agree", func() bool {
		n := f.mismatches()
		if n != 0 && time.Since(settle) > 10*time.Second && time.Since(settle) < 11*time.Second {
			t.Logf("%d mismatches 10 s after the load", n)
		}
		return n == 0
	})
	t.Logf("records and nodes agreed %v after the load", time.Since(settle).Round(time.Millisecond))
	f.checkAccounts(stats)
	f.checkQuorumLoss()
}

// checkQuorumLoss: with two of three servers (and their NATS members)
// killed, creates fail within seconds with 503 store_unavailable;
// sandboxes keep running and answer commands (the exec path needs no
// JetStream); once the two are back, creates succeed again without any
// manual step.
func (f *fleet) checkQuorumLoss() {
	t := f.t
	ctx := context.Background()
	only := f.serverClient(2)
	sb, err := only.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction})
	if err != nil {
		t.Fatal(err)
	}
	f.servers[0].kill()
	f.servers[1].kill()

	raw := f.serverClient(2, client.WithRetry(0))
	began := time.Now()
	_, err = raw.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction})
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 503 || e.Code != api.CodeStoreUnavailable {
		t.Fatalf("create without a quorum: %v, want 503 %s", err, api.CodeStoreUnavailable)
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Errorf("create without a quorum took %v to fail", took)
	}
	t.Logf("create without a quorum failed in %v: %v", time.Since(began).Round(time.Millisecond), err)
	// The node may have been connected to a killed member: it moves to
	// the live one within seconds.
	testenv.Eventually(t, time.Minute, "a command in a running sandbox without a quorum", func() bool {
		res, err := raw.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "up"}})
		return err == nil && res.Stdout == "up\n"
	})

	f.restartServer(0)
	f.restartServer(1)
	c := f.client()
	sb2, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, RequestID: "after-quorum"})
	if err != nil {
		t.Fatalf("create after the quorum came back: %v", err)
	}
	for _, id := range []string{sb.ID, sb2.ID} {
		got, err := c.GetSandbox(ctx, id)
		if err != nil || got.State != api.StateRunning {
			t.Errorf("sandbox %s after the quorum came back: %+v, %v", id, got, err)
		}
	}
}

// serverClient is a client of server i alone.
func (f *fleet) serverClient(i int, opts ...client.Option) *client.Client {
	f.t.Helper()
	c, err := client.New("http://"+f.scfg[i].API.Listen, f.token, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}
