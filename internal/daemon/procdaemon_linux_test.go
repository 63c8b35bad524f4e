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
	cfg.Container = config.Container{
		Name: h.Net, NetworkRange: h.Range.String(), NetworkPool: h.Pool,
		CgroupParent: h.CgroupParent, IDBase: h.IDBase,
	}
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
}

// startProcDaemon starts `dsec up` with cfg in a child process and waits
// until it serves.
func startProcDaemon(t *testing.T, cfg config.Config) *procDaemon {
	t.Helper()
	d := launchProcDaemon(t, cfg)
	addr, ok := waitFile(filepath.Join(cfg.DataDir, AddrFile), 2*time.Minute, d.exited)
	if !ok {
		t.Fatalf("the daemon did not start; its log:\n%s", d.logs.tail(16<<10))
	}
	tok, err := auth.Load(cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if d.c, err = client.New("http://"+addr, tok); err != nil {
		t.Fatal(err)
	}
	(&up{t: t, c: d.c}).waitHealthy()
	if !slices.ContainsFunc(daemonProcs(cfg.DataDir), func(p testenv.Proc) bool { return p.Pid == d.cmd.Process.Pid }) {
		t.Fatalf("daemonProcs does not find the daemon (pid %d)", d.cmd.Process.Pid)
	}
	return d
}

// launchProcDaemon starts `dsec up` with cfg in a child process.
func launchProcDaemon(t *testing.T, cfg config.Config) *procDaemon {
	t.Helper()
	_ = os.Remove(filepath.Join(cfg.DataDir, AddrFile)) // a killed daemon's
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &procDaemon{t: t, exited: make(chan struct{}), logs: &syncBuffer{}}
	d.cmd = exec.Command(os.Args[0], "-test.run=^$")
	d.cmd.Env = append(os.Environ(), "DSEC_TEST_DAEMON="+string(raw))
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
			t.Logf("daemon (pid %d) log:\n%s", d.cmd.Process.Pid, d.logs.tail(16<<10))
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
	<-d.exited
	if d.c != nil {
		d.c.CloseIdleConnections()
	}
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
		<-d.exited
	}
	if d.c != nil {
		d.c.CloseIdleConnections()
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		d.t.Errorf("the daemon exited with status %d", code)
	}
	if strings.Contains(d.logs.String(), "WARNING: DATA RACE") {
		d.t.Error("the daemon reported a data race")
	}
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
