package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/guard"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// containerHost is what a test's container tier puts on the host, named
// so that nothing else on the machine (another test binary, a real
// node) shares it: the network instance, cgroup parent and the host ids
// sandboxes map to.
type containerHost struct {
	testenv.Sandboxes
	Range   netip.Prefix
	IDBase  int
	IDCount int
	Pool    int
}

// newContainerHost names the container tier of test number n of this
// process (n < 8).
func newContainerHost(n int) containerHost {
	pid := os.Getpid()
	return containerHost{
		Sandboxes: testenv.Sandboxes{
			Net:          fmt.Sprintf("ds%04x%d", pid&0xffff, n),
			CgroupParent: fmt.Sprintf("dsec-soak-%d-%d", pid, n),
		},
		// 10.248.0.0/13 is this package's: a /16 per process, a /19 per
		// test.
		Range:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(248 + pid%6), byte(32 * n), 0}), 19),
		IDBase:  4_000_000 + (pid%64)*8*idCount + n*idCount,
		IDCount: idCount,
		Pool:    20,
	}
}

// shortTempDir is a data directory for a container tier: t.TempDir's
// names are too long for it, since a sandbox agent's socket path,
// <dir>/node/container/sandboxes/<id>/sock/agent.sock, must fit in the
// 108 bytes of a unix socket address. Its name starts with "Test" so that
// testenv.SweepStale finds its mounts if the test is killed.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "TestSoak")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing the data directory: %v", err)
		}
	})
	return dir
}

// containerConfig is a `dsec up` configuration on dir with the container
// tier on, named after h.
func containerConfig(t *testing.T, dir string, h containerHost) config.Config {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the container tier needs root (namespaces, mounts, cgroups, nftables)")
	}
	// Sandboxes must walk down to the data directory (see
	// container.reachable): t.TempDir makes its directories 0700.
	tmp := filepath.Clean(os.TempDir())
	for p := filepath.Clean(dir); p != tmp && strings.HasPrefix(p, tmp+"/"); p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Defaults()
	cfg.DataDir = dir
	cfg.API.Listen = "127.0.0.1:0"
	cfg.NATS.Listen = "none"
	cfg.Node.ID = "soak-node"
	cfg.LogLevel = "warn"
	cfg.Images.BuiltinCache = builtinCache
	cfg.Images.SkipSlow = true
	cfg.Node.FunctionCacheDir = wasmCache
	cfg.Container = config.Container{
		Name: h.Net, NetworkRange: h.Range.String(), NetworkPool: h.Pool,
		CgroupParent: h.CgroupParent, IDBase: h.IDBase,
	}
	cfg.MicroVM.Disabled = true
	return cfg
}

// procDaemon is `dsec up` running as a child process (this test binary,
// see TestMain), so that a test can kill it with SIGKILL.
type procDaemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	exited chan struct{}
	logs   *syncBuffer
	c      *client.Client
	cfg    config.Config
	// guarded: the node reported its cgroup-bpf guard on (checkGuard).
	guarded bool
}

// startProcDaemon starts `dsec up` with cfg in a child process and waits
// until it serves.
func startProcDaemon(t *testing.T, cfg config.Config) *procDaemon {
	t.Helper()
	d := launchProcDaemon(t, cfg)
	addr, ok := waitFile(filepath.Join(cfg.DataDir, AddrFile), 2*time.Minute, d.exited)
	if !ok {
		t.Fatalf("the daemon did not start; its log:\n%s", d.logs.tail(64<<10))
	}
	tok, err := auth.Load(cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if d.c, err = client.New("http://"+addr, tok); err != nil {
		t.Fatal(err)
	}
	(&up{t: t, c: d.c}).waitHealthy()
	d.checkGuard(true)
	if !slices.ContainsFunc(daemonProcs(cfg.DataDir), func(p testenv.Proc) bool { return p.Pid == d.cmd.Process.Pid }) {
		t.Fatalf("daemonProcs does not find the daemon (pid %d)", d.cmd.Process.Pid)
	}
	return d
}

// launchProcDaemon starts `dsec up` with cfg in a child process; env is
// added to its environment (DSEC_TEST_ROLE=node runs the node role).
func launchProcDaemon(t *testing.T, cfg config.Config, env ...string) *procDaemon {
	t.Helper()
	_ = os.Remove(filepath.Join(cfg.DataDir, AddrFile)) // a killed daemon's
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &procDaemon{t: t, exited: make(chan struct{}), logs: &syncBuffer{}, cfg: cfg}
	d.cmd = exec.Command(os.Args[0], "-test.run=^$")
	d.cmd.Env = append(append(os.Environ(), "DSEC_TEST_DAEMON="+string(raw)), env...)
	d.cmd.Stderr = d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			d.stop()
		}
		if t.Failed() {
			t.Logf("daemon (pid %d) log:\n%s", d.cmd.Process.Pid, d.logs.tail(64<<10))
		}
	})
	return d
}

// kill is kill -9.
func (d *procDaemon) kill() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		d.t.Fatal(err)
	}
	testenv.Recv(d.t, d.exited, time.Minute, "the daemon to exit after SIGKILL")
	if d.c != nil {
		d.c.CloseIdleConnections()
	}
	d.checkGuard(true) // the pins hold it: kept sandboxes stay guarded
}

// stop asks the daemon to shut down (SIGTERM) and checks it exits
// cleanly.
func (d *procDaemon) stop() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(2 * time.Minute):
		d.t.Error("the daemon did not stop within 2 minutes; killing it")
		_ = d.cmd.Process.Kill()
		testenv.Recv(d.t, d.exited, time.Minute, "the daemon to exit after SIGKILL")
	}
	if d.c != nil {
		d.c.CloseIdleConnections()
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		d.t.Errorf("the daemon exited with status %d", code)
	}
	if !d.cfg.KeepSandboxes {
		d.checkGuard(false) // no sandbox left: nothing attached or pinned
	}
	if strings.Contains(d.logs.String(), "WARNING: DATA RACE") {
		d.t.Error("the daemon reported a data race")
	}
}

// checkGuard checks the cgroup-bpf guard of a container tier: attached
// once to the cgroup parent (on a started node, after a restart too, and
// after a kill -9: its pinned links outlive the node), or neither
// attached nor pinned. It checks nothing where the node never reported
// the guard on.
func (d *procDaemon) checkGuard(attached bool) {
	d.t.Helper()
	if d.cfg.Container.Disabled {
		return
	}
	if attached && !d.guarded && d.c != nil {
		nodes, err := d.c.Nodes(context.Background())
		if err != nil || len(nodes.Nodes) != 1 {
			d.t.Fatalf("nodes: %+v, %v", nodes, err)
		}
		if d.guarded = nodes.Nodes[0].Guard == "on"; !d.guarded {
			d.t.Logf("no cgroup-bpf guard to check: %s", nodes.Nodes[0].Guard)
		}
	}
	if !d.guarded {
		return
	}
	parent2 := filepath.Join("/sys/fs/cgroup/unified", d.cfg.Container.CgroupParent)
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err != nil {
		parent2 = filepath.Join("/sys/fs/cgroup", d.cfg.Container.CgroupParent)
	}
	var want []string
	if attached {
		want = guard.ProgramNames()
	}
	got, err := guard.Attached(parent2)
	if err != nil && !(os.IsNotExist(err) && !attached) {
		d.t.Errorf("guard programs of %s: %v", parent2, err)
	} else if !slices.Equal(got, want) {
		d.t.Errorf("guard programs attached to %s: %q, want %q", parent2, got, want)
	}
	if left := testenv.HostLeftovers(testenv.Sandboxes{GuardPins: guard.PinDir(d.cfg.Container.Name)}); !attached && len(left) > 0 {
		d.t.Errorf("the guard's pins outlive the node: %q", left)
	}
}

// TestContainerGuardAcrossRestart: a live container sandbox keeps the
// cgroup-bpf guard while its node is down, after a shutdown that keeps
// sandboxes as after a kill -9, and the restarted node takes the guard
// over (checkGuard, in startProcDaemon, kill and stop); once the last
// sandbox is gone with its node, nothing of the guard is left.
func TestContainerGuardAcrossRestart(t *testing.T) {
	dir := shortTempDir(t)
	h := newContainerHost(2)
	h.GuardPins = guard.PinDir(h.Net)
	t.Cleanup(func() { noContainerLeftovers(t, dir, h) })
	cfg := containerConfig(t, dir, h)
	cfg.KeepSandboxes = true
	d := startProcDaemon(t, cfg)
	if !d.guarded {
		t.Skip("no cgroup-bpf guard on this host")
	}
	ctx, cancel := waitCtx()
	defer cancel()
	sb, err := d.c.CreateSandbox(ctx, soakRequest(0))
	if err != nil {
		t.Fatal(err)
	}
	d.stop()
	d.checkGuard(true)
	d = startProcDaemon(t, cfg)
	d.kill()
	cfg.KeepSandboxes = false
	d = startProcDaemon(t, cfg)
	if err := soakExec(ctx, d.c, sb.ID); err != nil {
		t.Error(err)
	}
	d.stop() // destroys the sandbox
}

// syncBuffer collects a child's output.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) tail(n int) string {
	str := s.String()
	if len(str) > n {
		str = "…" + str[len(str)-n:]
	}
	return str
}

// waitCtx is a context for one call of a soak, bounded so that a hung
// daemon fails the test instead of stalling it.
func waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Minute)
}
