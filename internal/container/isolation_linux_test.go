package container

// The isolation tests of the security catalogue
// (docs/adversarial.md): each attack runs inside a
// container sandbox and the test asserts the safe outcome; each also runs
// where the defence is absent — on the host as root, in a sandbox without
// seccomp, against a target the node itself reaches — and the test
// asserts that it behaves differently there, so that no assertion holds
// by construction. The attacker is testdata/probe (system calls busybox
// cannot make), shipped in a layer of its own at /opt/probe/probe, and
// busybox.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// probePath is where sandboxes of the probe image have the probe.
const probePath = "/opt/probe/probe"

// capProbePath is a copy of the probe carrying a file capability
// (cap_setuid+ep), for A59.
const capProbePath = "/opt/probe/capprobe"

// probeBin is the probe built for this test binary: on the host and as a
// layer.
type probeBin struct {
	// dir is searchable by every uid (0755 under the world's 0711
	// directory): the host controls run the probe as other users.
	dir string
	// host is the probe on the host; capHost the copy with the file
	// capability (the same file the layer has at capProbePath).
	host, capHost string
	layer         layerspec.Layer
}

var probeBuild struct {
	once sync.Once
	bin  *probeBin
	err  error
}

// theProbe builds the probe and its layer once per test binary, in the
// world's directory (removed by TestMain).
func theProbe(t testing.TB) *probeBin {
	t.Helper()
	w := world.get(t)
	probeBuild.once.Do(func() { probeBuild.bin, probeBuild.err = buildProbe(w) })
	if probeBuild.err != nil {
		t.Fatalf("building the probe: %v", probeBuild.err)
	}
	return probeBuild.bin
}

func buildProbe(w *testWorld) (*probeBin, error) {
	ctx := context.Background()
	dir := filepath.Join(w.dir, "probe")
	tree := filepath.Join(dir, "tree")
	bin := filepath.Join(tree, "opt", "probe")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{dir, tree, filepath.Join(tree, "opt"), bin} {
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	p := &probeBin{dir: dir, host: filepath.Join(bin, "probe"), capHost: filepath.Join(bin, "capprobe")}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", p.host, "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, out)
	}
	b, err := os.ReadFile(p.host)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.capHost, b, 0o755); err != nil {
		return nil, err
	}
	// security.capability, VFS_CAP_REVISION_2: cap_setuid (7) permitted,
	// effective flag set.
	fcaps := []byte{0x01, 0x00, 0x00, 0x02, 1 << 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := sys.SetXattr(p.capHost, "security.capability", fcaps); err != nil {
		return nil, err
	}
	a, err := layer.BuildDir(ctx, tree, filepath.Join(dir, "layer"), layer.BuildOptions{})
	if err != nil {
		return nil, err
	}
	if p.layer, err = w.publish(ctx, a); err != nil {
		return nil, err
	}
	return p, nil
}

// probeImage is busybox, the probe and the agent (topmost, where the
// runtime finds it).
func probeImage(t testing.TB) sandbox.Image {
	w, p := world.get(t), theProbe(t)
	return sandbox.Image{
		ID: "busybox-probe", Name: "busybox-probe",
		Layers: []layerspec.Layer{w.busybox[0], p.layer, w.busybox[1]},
	}
}

// isoEnv is what the isolation subtests share: the runtime, the probe
// image and a secret on the host that no sandbox may ever read.
type isoEnv struct {
	rt  *testRuntime
	img sandbox.Image
	p   *probeBin
	// secret is the content of secretPath, a file at the top of the
	// host's temporary directory (on the host's root file system, so
	// that a path walked up from anywhere on it reaches the file).
	secret, secretPath string
	// secretRel is secretPath relative to the host's root.
	secretRel string
	// marker is in the command line of the test process (and no
	// sandbox's): a sandbox that sees it sees host processes.
	marker string
	// noSec is a sandbox of a second runtime that installs no seccomp
	// filter: the negative control of the defences seccomp provides.
	noSec *Sandbox
	// audit is what the eBPF monitor saw in the sandboxes of rt (not
	// noSec's runtime: it is not watched).
	audit *auditLog
}

func newIsoEnv(t *testing.T, rt *testRuntime) *isoEnv {
	e := &isoEnv{rt: rt, img: probeImage(t), p: theProbe(t), marker: filepath.Base(os.Args[0])}
	buf := make([]byte, 16)
	_, _ = rand.Read(buf)
	e.secret = "dsec-host-secret-" + hex.EncodeToString(buf)
	e.secretPath = filepath.Join(os.TempDir(), fmt.Sprintf("dsec-isolation-secret-%d", os.Getpid()))
	if err := os.WriteFile(e.secretPath, []byte(e.secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(e.secretPath) })
	e.secretRel = strings.TrimPrefix(e.secretPath, "/")
	return e
}

// create makes a sandbox of the probe image, destroyed when the test
// ends.
func (e *isoEnv) create(t testing.TB, id string, adjust func(*sandbox.Spec)) *Sandbox {
	t.Helper()
	return createIn(t, e.rt, sandbox.Spec{ID: id, Image: e.img}, adjust)
}

func createIn(t testing.TB, rt *testRuntime, spec sandbox.Spec, adjust func(*sandbox.Spec)) *Sandbox {
	t.Helper()
	if adjust != nil {
		adjust(&spec)
	}
	ctx := context.Background()
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("creating sandbox %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("destroying %s: %v", spec.ID, err)
		}
	})
	return sb.(*Sandbox)
}

// run runs a command in sb; it fails the test if the command could not
// run at all.
func run(t testing.TB, sb sandbox.Sandbox, cmd ...string) api.ExecResult {
	t.Helper()
	return runReq(t, sb, api.ExecRequest{Cmd: cmd, TimeoutS: 60})
}

func runReq(t testing.TB, sb sandbox.Sandbox, req api.ExecRequest) api.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: req})
	if err != nil {
		t.Fatalf("%q in %s: %v", req.Cmd, sb.ID(), err)
	}
	return res
}

// kv is a probe's output: key=value per line, and on a line with more
// fields, "first.key" for each later key=value.
type kv map[string]string

func parseKV(out string) kv {
	m := kv{}
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(strings.TrimRight(line, "\r"))
		if len(fields) == 0 {
			continue
		}
		k, v, ok := strings.Cut(fields[0], "=")
		if !ok {
			continue
		}
		m[k] = v
		for _, f := range fields[1:] {
			if fk, fv, ok := strings.Cut(f, "="); ok {
				m[k+"."+fk] = fv
			}
		}
	}
	return m
}

// fieldsKV parses the key=value fields of one line.
func fieldsKV(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// get returns key's value; a probe that printed no such key is broken.
func (m kv) get(t testing.TB, key string) string {
	t.Helper()
	v, ok := m[key]
	if !ok {
		t.Fatalf("the probe printed no %q: %v", key, m)
	}
	return v
}

// probeIn runs the probe in sb and parses what it printed.
func probeIn(t testing.TB, sb sandbox.Sandbox, args ...string) kv {
	t.Helper()
	res := run(t, sb, append([]string{probePath}, args...)...)
	if res.ExitCode != 0 {
		t.Fatalf("probe %q in %s: %+v", args, sb.ID(), res)
	}
	return parseKV(res.Stdout)
}

// hostProbe runs the probe on the host as root (or as attr says).
func (e *isoEnv) hostProbe(t testing.TB, attr *syscall.SysProcAttr, args ...string) kv {
	t.Helper()
	return parseKV(hostRun(t, attr, e.p.host, args...))
}

// hostRun runs a program on the host and returns its stdout; it fails
// the test if the program fails.
func hostRun(t testing.TB, attr *syscall.SysProcAttr, prog string, args ...string) string {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.SysProcAttr = attr
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %q on the host: %v\n%s%s", prog, args, err, out, stderr.Bytes())
	}
	return string(out)
}

// privateMounts runs a host control in a mount namespace of its own (Go
// makes its mounts private), so that what it mounts stays there.
var privateMounts = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}

// expect checks the errno names a probe printed for calls.
func expect(t testing.TB, where string, got kv, want map[string][]string) {
	t.Helper()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if v := got.get(t, k); !slices.Contains(want[k], v) {
			t.Errorf("%s: %s = %s, want %s", where, k, v, strings.Join(want[k], " or "))
		}
	}
}

// expectNot checks that calls did not end with any of the given errnos
// (the negative control: there the defence is absent).
func expectNot(t testing.TB, where string, got kv, keys []string, not ...string) {
	t.Helper()
	for _, k := range keys {
		if v := got.get(t, k); slices.Contains(not, v) {
			t.Errorf("%s (the negative control): %s = %s: the probe cannot tell the defence from its absence", where, k, v)
		}
	}
}

// sysArgs turns map keys as the probe prints them (name:args) back into
// its arguments (name=args).
func sysArgs(keys ...string) []string {
	out := []string{"sys"}
	for _, k := range keys {
		out = append(out, strings.Replace(k, ":", "=", 1))
	}
	return out
}

// all maps every key to the same wanted errnos.
func all(keys []string, errnos ...string) map[string][]string {
	m := map[string][]string{}
	for _, k := range keys {
		m[k] = errnos
	}
	return m
}

// TestIsolation runs the catalogue's attacks on the container tier.
func TestIsolation(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) }) // after the runtime's own cleanup
	// The node's prefixes, as the node service gives the node-connect rule:
	// the runtime's sandbox network and the node's own addresses.
	_, netRange := names(dir)
	rec, log := startAudit(t, append(hostPrefixes(t), netRange, netip.PrefixFrom(network.DefaultGateway, 32))...)
	rt := newRuntime(t, dir, runtimeOptions{monitor: rec})
	e := newIsoEnv(t, rt)
	e.audit = log
	// The sandbox most probes attack from: they change nothing outside
	// themselves. Tests that kill, fill or flood get sandboxes of their own.
	main := e.create(t, "iso-main", nil)
	noSecDir := t.TempDir()
	t.Cleanup(func() { checkHost(t, noSecDir) })
	noSecRT := newRuntime(t, noSecDir, runtimeOptions{noSeccomp: true})
	e.noSec = createIn(t, noSecRT, sandbox.Spec{ID: "iso-noseccomp", Image: e.img}, nil)

	t.Run("seam", func(t *testing.T) { testSeam(t, e, main) })
	t.Run("kernel", func(t *testing.T) { testKernel(t, e, main) })
	t.Run("network", func(t *testing.T) { testNetwork(t, e, main) })
	t.Run("files", func(t *testing.T) { testFileAPI(t, e, main) })
	t.Run("resources", func(t *testing.T) { testResources(t, e, main) })
	t.Run("privilege", func(t *testing.T) { testPrivilege(t, e, main) })
	t.Run("adversarial", func(t *testing.T) { testAdversarial(t, e, main) })
	// The control of every audit assertion: the unwatched runtime's
	// sandbox ran the same attacks and left no event.
	e.unaudited(t, e.noSec.id)
}
