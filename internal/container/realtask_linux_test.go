package container

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// The real-task image: what a software-engineering rollout runs in.
//
//	base/debian-12      debootstrap minbase (cached per day, see DebianForTest)
//	workspace/hello     a small Go module, plus files owned by other users
//	toolkit/go          the host's Go toolchain at /usr/local/go
//	toolkit/dsec-guest  the agent
//
// Nothing is installed in the sandbox (no apt-get, no network): the
// toolchain arrives as a read-only layer, as a toolkit would.
var realTaskImage struct {
	once sync.Once
	img  sandbox.Image
	err  error
}

// goRoot is where the toolkit layer puts the toolchain.
const goRoot = "/usr/local/go"

// realImage builds the real-task image once per test binary.
func realImage(t *testing.T) sandbox.Image {
	t.Helper()
	w := world.get(t)
	debian := builtin.DebianForTest(t) // outside once: it logs to t
	r := &realTaskImage
	r.once.Do(func() { r.img, r.err = buildRealImage(t, w, debian) })
	if r.err != nil {
		t.Fatalf("building the real-task image: %v", r.err)
	}
	return r.img
}

func buildRealImage(t *testing.T, w *testWorld, debian layer.Artifact) (sandbox.Image, error) {
	ctx := context.Background()
	base, err := w.publish(ctx, debian)
	if err != nil {
		return sandbox.Image{}, err
	}
	goroot, err := hostGoRoot()
	if err != nil {
		return sandbox.Image{}, err
	}
	start := time.Now()
	toolchain, err := buildTreeLayer(ctx, w, func(dir string) error {
		return copyGoRoot(goroot, filepath.Join(dir, goRoot[1:]))
	})
	if err != nil {
		return sandbox.Image{}, fmt.Errorf("toolkit/go from %s: %w", goroot, err)
	}
	t.Logf("toolkit/go from %s: %.1f MiB in %s", goroot,
		float64(toolchain.Manifest.Meta.Size+toolchain.Manifest.Blob.Size)/(1<<20), time.Since(start).Round(time.Millisecond))
	workspace, err := buildTreeLayer(ctx, w, fillWorkspace)
	if err != nil {
		return sandbox.Image{}, fmt.Errorf("workspace/hello: %w", err)
	}
	guest := w.busybox[len(w.busybox)-1]
	return sandbox.Image{
		ID: "real-task", Name: "real-task",
		Layers: []layerspec.Layer{base, workspace, toolchain, guest},
	}, nil
}

// hostGoRoot is the toolchain this test binary was built with.
func hostGoRoot() (string, error) {
	//lint:ignore SA1019 the test copies the toolchain that built it
	if r := runtime.GOROOT(); r != "" {
		if _, err := os.Stat(filepath.Join(r, "bin", "go")); err == nil {
			return r, nil
		}
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("finding GOROOT (runtime.GOROOT is empty): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// buildTreeLayer fills a scratch tree, builds a layer of it with
// layer.BuildDir and publishes it to the world's store; the scratch tree
// and artifact are removed (the store keeps the files).
func buildTreeLayer(ctx context.Context, w *testWorld, fill func(dir string) error) (layerspec.Layer, error) {
	scratch, err := os.MkdirTemp(w.dir, "tree-")
	if err != nil {
		return layerspec.Layer{}, err
	}
	defer os.RemoveAll(scratch)
	tree := filepath.Join(scratch, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return layerspec.Layer{}, err
	}
	if err := fill(tree); err != nil {
		return layerspec.Layer{}, err
	}
	a, err := layer.BuildDir(ctx, tree, filepath.Join(scratch, "out"), layer.BuildOptions{})
	if err != nil {
		return layerspec.Layer{}, err
	}
	return w.publish(ctx, a)
}

// copyGoRoot copies what building and testing Go code needs of a
// GOROOT (the commands, tools, standard library sources, go.env and
// VERSION), owned by root; test data, tests and docs stay out.
func copyGoRoot(src, dst string) error {
	skipTop := map[string]bool{"test": true, "api": true, "doc": true, "misc": true, ".git": true}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() && (skipTop[rel] || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			return os.Chmod(target, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case fi.Mode().IsRegular():
			return copyFile(p, target, fi.Mode().Perm())
		}
		return nil // nothing else belongs in a GOROOT
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode) // past the umask
}

// The workspace: a Go module with a package, its test and a main, and
// files of other owners that root (without capabilities) may write.
var helloFiles = map[string]string{
	"go.mod": "module example.com/hello\n\ngo 1.22\n",
	"main.go": `package main

import (
	"fmt"
	"os"

	"example.com/hello/greet"
)

func main() {
	name := "dsec"
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	fmt.Println(greet.Greet(name))
}
`,
	"greet/greet.go": `// Package greet greets.
package greet

// Greet says hello to name.
func Greet(name string) string { return "hello, " + name }
`,
	"greet/greet_test.go": `package greet

import "testing"

func TestGreet(t *testing.T) {
	if got := Greet("dsec"); got != "hello, dsec" {
		t.Fatalf("Greet(dsec) = %q", got)
	}
}
`,
	"README": "a small Go project\n",
}

// Owners in the workspace layer (in-image ids; the sandbox sees these).
const (
	userID   = 1000  // "user", made by base/debian-12
	nobodyID = 65534 // "nobody"
)

func fillWorkspace(dir string) error {
	for _, d := range []string{"workspace", "workspace/hello", "workspace/hello/greet"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for name, content := range helloFiles {
		if err := os.WriteFile(filepath.Join(dir, "workspace/hello", name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// A directory and file of user that everyone may write, and a file
	// of nobody's that only nobody may.
	shared := filepath.Join(dir, "workspace/shared")
	for _, e := range []struct {
		path     string
		mode     fs.FileMode
		uid, gid int
		content  string
	}{
		{shared, fs.ModeDir | 0o777, userID, userID, ""},
		{filepath.Join(shared, "log.txt"), 0o666, userID, userID, "first line\n"},
		{filepath.Join(dir, "workspace/nobody.txt"), 0o644, nobodyID, nobodyID, "nobody's\n"},
	} {
		var err error
		if e.mode.IsDir() {
			err = os.Mkdir(e.path, e.mode.Perm())
		} else {
			err = os.WriteFile(e.path, []byte(e.content), e.mode.Perm())
		}
		if err != nil {
			return err
		}
		if err := os.Chmod(e.path, e.mode.Perm()); err != nil {
			return err
		}
		if err := os.Lchown(e.path, e.uid, e.gid); err != nil {
			return err
		}
	}
	return nil
}

// goEnv is the environment of Go commands in the sandbox: caches in
// /tmp (the sandbox's writable layer), the image's toolchain and nothing
// from the network.
var goEnv = map[string]string{
	"PATH":        goRoot + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"GOCACHE":     "/tmp/gocache",
	"GOPATH":      "/tmp/gopath",
	"GOTOOLCHAIN": "local",
	"GOPROXY":     "off",
	"GOFLAGS":     "-mod=readonly",
	"CGO_ENABLED": "0", // minbase has no C compiler
}

// bash runs a bash script in sb as the sandbox's root.
func bash(t *testing.T, sb sandbox.Sandbox, script string) api.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		Cmd: []string{"/bin/bash", "-c", script}, Env: goEnv, TimeoutS: 300,
	}})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}

// bashOK runs a script that must succeed and returns its stdout.
func bashOK(t *testing.T, sb sandbox.Sandbox, script string) string {
	t.Helper()
	res := bash(t, sb, script)
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d (%s)\nstdout: %s\nstderr: %s", script, res.ExitCode, res.Error, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// TestRealTask runs a software-engineering task in sandboxes of the
// real-task image: building and testing Go code offline, writing among
// files of the image's users, writes that live and die with a sandbox,
// and siblings that share nothing. Nothing of them is left on the host.
func TestRealTask(t *testing.T) {
	needRoot(t)
	img := realImage(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) }) // after the runtime's own cleanup
	rt := newRuntime(t, dir, runtimeOptions{})
	n := 0
	// linked: a narrow allow-list, for a network of the node's.
	linked := &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "203.0.113.7/32", Proto: "tcp", Ports: "9"}}}
	create := func(t *testing.T, memMB, diskMB int, policy ...*api.NetworkPolicy) sandbox.Sandbox {
		t.Helper()
		n++
		start := time.Now()
		spec := sandbox.Spec{
			ID: fmt.Sprintf("real-%d", n), Tier: Tier, Image: img, CPU: 2, MemoryMB: memMB, DiskMB: diskMB,
		}
		if len(policy) > 0 {
			spec.Network = policy[0]
		}
		sb, err := rt.Create(context.Background(), spec)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		t.Logf("created %s in %s", sb.ID(), time.Since(start).Round(time.Microsecond))
		t.Cleanup(func() {
			if err := sb.Destroy(context.Background()); err != nil {
				t.Errorf("Destroy %s: %v", sb.ID(), err)
			}
		})
		return sb
	}
	t.Run("GoBuildAndTest", func(t *testing.T) { testGoBuildAndTest(t, create(t, 1024, 512), rt.names.CgroupParent) })
	t.Run("ImageOwners", func(t *testing.T) { testImageOwners(t, create(t, 256, 64)) })
	t.Run("WritesLiveAndDieWithTheSandbox", func(t *testing.T) {
		testWritesLifetime(t, func() sandbox.Sandbox { return create(t, 256, 64) })
	})
	// Siblings with networks of the node's (those without any have only
	// their own loopback interfaces, and nothing to reach each other by).
	t.Run("SiblingsIsolated", func(t *testing.T) { testSiblingsIsolated(t, create(t, 256, 64, linked), create(t, 256, 64, linked)) })
}

// testGoBuildAndTest builds and tests the workspace's module with the
// image's toolchain, offline, and checks that a broken test fails.
func testGoBuildAndTest(t *testing.T, sb sandbox.Sandbox, parent string) {
	if out := bashOK(t, sb, "go version"); !strings.Contains(out, runtime.Version()+" ") {
		t.Errorf("go version in the sandbox = %q, want the host's %s", out, runtime.Version())
	}
	// Offline for real: nothing could have been downloaded.
	if res := bash(t, sb, "timeout 5 bash -c 'exec 3<>/dev/tcp/1.1.1.1/443'"); res.ExitCode == 0 {
		t.Errorf("a sandbox without egress connected out: %+v", res)
	}
	// No C toolchain, no package lists: the task needs neither.
	if res := bash(t, sb, "command -v gcc cc; ls /var/lib/apt/lists | grep -v -e '^lock$' -e '^partial$' -e '^auxfiles$'"); strings.TrimSpace(res.Stdout) != "" {
		t.Errorf("the image has a C compiler or package lists: %q", res.Stdout)
	}

	start := time.Now()
	bashOK(t, sb, "cd /workspace/hello && go build -o hello .")
	build := time.Since(start)
	if out := bashOK(t, sb, "/workspace/hello/hello sandbox"); out != "hello, sandbox\n" {
		t.Errorf("the built program printed %q", out)
	}
	start = time.Now()
	out := bashOK(t, sb, "cd /workspace/hello && go test ./... 2>&1")
	test := time.Since(start)
	if !strings.Contains(out, "ok  \texample.com/hello/greet") {
		t.Errorf("go test ./... passed without testing greet:\n%s", out)
	}
	t.Logf("in the sandbox: go build %s (standard library from source), go test %s", build.Round(time.Millisecond), test.Round(time.Millisecond))

	// The check can fail: a broken test makes go test exit 1.
	broken := strings.Replace(helloFiles["greet/greet_test.go"], `"hello, dsec"`, `"goodbye, dsec"`, 1)
	if _, err := sb.Files().Write(context.Background(), "/workspace/hello/greet/greet_test.go", strings.NewReader(broken), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	res := bash(t, sb, "cd /workspace/hello && go test ./... 2>&1")
	if res.ExitCode != 1 || !strings.Contains(res.Stdout, "--- FAIL: TestGreet") || !strings.Contains(res.Stdout, "FAIL\texample.com/hello/greet") {
		t.Errorf("go test of a broken test: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if s, err := sb.Stats(context.Background()); err == nil {
		t.Logf("after the build: memory %.0f MiB (peak %.0f MiB), upper %.0f MiB", float64(s.MemoryBytes)/(1<<20),
			float64(memoryPeak(parent, sb.ID()))/(1<<20), float64(s.DiskBytes)/(1<<20))
	}
}

// memoryPeak reads a sandbox's peak memory use from the host's cgroup
// files (the sandbox's own /sys/fs/cgroup is masked); 0 if unknown.
func memoryPeak(parent, id string) int64 {
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup", parent, id, "memory.peak"),
		filepath.Join("/sys/fs/cgroup/memory", parent, id, "memory.max_usage_in_bytes"),
	} {
		if b, err := os.ReadFile(f); err == nil {
			var n int64
			if _, err := fmt.Sscan(string(b), &n); err == nil {
				return n
			}
		}
	}
	return 0
}

// testImageOwners checks that files of other owners in the layers show
// with their in-image owners, and how the sandbox's root (which holds no
// capabilities) writes among them: the writes copy files up to the
// sandbox's layer and keep their owners.
func testImageOwners(t *testing.T, sb sandbox.Sandbox) {
	want := map[string]string{
		"/var/mail":                 "root:mail 2775",
		"/var/local":                "root:staff 2775",
		"/var/log/wtmp":             "root:utmp 664",
		"/usr/bin/chage":            "root:shadow 2755",
		"/etc/shadow":               "root:shadow 640",
		"/home/user":                "user:user 755",
		"/home/user/.bashrc":        "user:user 644",
		"/workspace/shared":         "user:user 777",
		"/workspace/shared/log.txt": "user:user 666",
		"/workspace/nobody.txt":     "nobody:nogroup 644",
		"/workspace/hello/main.go":  "root:root 644",
		"/usr/local/go/bin/go":      "root:root 755",
	}
	var paths []string
	for p := range want {
		paths = append(paths, p)
	}
	got := statOwners(t, sb, paths...)
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: %q, want %q", p, got[p], w)
		}
	}

	// Root writes a file of user's that everyone may write (copy-up) and
	// creates one in user's world-writable directory; the first keeps
	// its owner, the second is root's.
	bashOK(t, sb, "echo second line >> /workspace/shared/log.txt && echo mine > /workspace/shared/roots.txt")
	if out := bashOK(t, sb, "cat /workspace/shared/log.txt"); out != "first line\nsecond line\n" {
		t.Errorf("log.txt after an append: %q", out)
	}
	// A file made in a setgid directory of group mail gets that group.
	bashOK(t, sb, "touch /var/mail/root && mkdir -p /var/tmp/a/b && echo x > /etc/dsec-test && chmod 600 /etc/dsec-test && chown root:root /etc/dsec-test")
	got = statOwners(t, sb, "/workspace/shared/log.txt", "/workspace/shared/roots.txt", "/var/mail/root", "/var/tmp/a/b", "/etc/dsec-test", "/var/mail")
	for p, w := range map[string]string{
		"/workspace/shared/log.txt":   "user:user 666",
		"/workspace/shared/roots.txt": "root:root 644",
		"/var/mail/root":              "root:mail 644",
		"/var/tmp/a/b":                "root:root 755",
		"/etc/dsec-test":              "root:root 600",
		"/var/mail":                   "root:mail 2775",
	} {
		if got[p] != w {
			t.Errorf("after the writes, %s: %q, want %q", p, got[p], w)
		}
	}
	// Root holds no capabilities (see TestCommandsHoldNoCapabilities): it
	// cannot give files away or write what only another user may.
	for _, script := range []string{
		"chown user /etc/dsec-test",
		"echo x >> /workspace/nobody.txt",
		"echo x >> /home/user/.bashrc",
	} {
		if res := bash(t, sb, script); res.ExitCode == 0 {
			t.Errorf("%q succeeded as the sandbox's root, which holds no capabilities", script)
		}
	}
	// The agent writes through the files API as root with its
	// capabilities: into user's home, beside user's files.
	if _, err := sb.Files().Write(context.Background(), "/home/user/from-api.txt", strings.NewReader("api\n"), sandbox.WriteOptions{}); err != nil {
		t.Errorf("writing into user's home through the files API: %v", err)
	}
	if got := statOwners(t, sb, "/home/user/from-api.txt", "/home/user"); got["/home/user/from-api.txt"] != "root:root 644" || got["/home/user"] != "user:user 755" {
		t.Errorf("after a files API write into /home/user: %q", got)
	}
}

// statOwners returns "owner:group mode" for each path, by stat(1) in sb.
func statOwners(t *testing.T, sb sandbox.Sandbox, paths ...string) map[string]string {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		Cmd: append([]string{"stat", "-c", "%n %U:%G %a"}, paths...),
	}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("stat %q: %v %+v", paths, err, res)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		if p, rest, ok := strings.Cut(line, " "); ok {
			got[p] = rest
		}
	}
	return got
}

// testWritesLifetime checks that a sandbox's writes (new files, changed
// and removed image files, through commands and the files API) last as
// long as it does, and that a new sandbox of the image starts pristine.
func testWritesLifetime(t *testing.T, create func() sandbox.Sandbox) {
	ctx := context.Background()
	const (
		writes = `set -e
echo made > /root/made.txt
echo changed >> /etc/motd
rm /workspace/hello/README
mkdir -p /opt/new/dir && echo deep > /opt/new/dir/f`
		check = `cat /root/made.txt /opt/new/dir/f /workspace/api.txt; tail -n1 /etc/motd; test -e /workspace/hello/README && echo README-present || echo README-gone`
	)
	a := create()
	bashOK(t, a, writes)
	if _, err := a.Files().Write(ctx, "/workspace/api.txt", strings.NewReader("through the api\n"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	const after = "made\ndeep\nthrough the api\nchanged\nREADME-gone\n"
	for i := range 2 { // read twice: the writes stay
		if out := bashOK(t, a, check); out != after {
			t.Errorf("read %d in the writing sandbox: %q, want %q", i, out, after)
		}
	}
	if err := a.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	b := create()
	// Its check finds none of the files, motd as the image has it, and
	// the README.
	pristine := bashOK(t, b, "tail -n1 /etc/motd") + "README-present\n"
	if res := bash(t, b, check); res.Stdout != pristine || strings.Count(res.Stderr, "No such file") != 3 {
		t.Errorf("a new sandbox of the image sees another's writes: %q (stderr %q), want %q", res.Stdout, res.Stderr, pristine)
	}
	for _, p := range []string{"/root/made.txt", "/workspace/api.txt", "/opt/new"} {
		if _, err := b.Files().Stat(ctx, p); err == nil {
			t.Errorf("a new sandbox of the image has %s", p)
		}
	}
}

// testSiblingsIsolated checks that two sandboxes of one image share no
// files, processes or network, with positive controls: each sees its own.
func testSiblingsIsolated(t *testing.T, a, b sandbox.Sandbox) {
	ctx := context.Background()
	// Files: the same path, different contents.
	bashOK(t, a, "echo a > /tmp/mine && echo a > /workspace/mine")
	bashOK(t, b, "echo b > /tmp/mine")
	if out := bashOK(t, a, "cat /tmp/mine /workspace/mine"); out != "a\na\n" {
		t.Errorf("a reads its files as %q", out)
	}
	if res := bash(t, b, "cat /tmp/mine /workspace/mine"); res.Stdout != "b\n" || res.ExitCode == 0 {
		t.Errorf("b reads a's files: %+v", res)
	}

	// Processes: a background process of a's, by its unique argv.
	pr, ok := a.(sandbox.ProcessRunner)
	if !ok {
		t.Fatal("container sandboxes must run background processes")
	}
	if _, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "31337"}}}); err != nil {
		t.Fatal(err)
	}
	const findSleep = `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 31337 $'`
	if out := bashOK(t, a, findSleep); out != "1\n" {
		t.Errorf("a sees its own sleep %q times", out)
	}
	if res := bash(t, b, findSleep); res.Stdout != "0\n" {
		t.Errorf("b sees a's process: %+v", res)
	}
	// b's /proc holds its own few processes: its agent (PID 1), this
	// shell and its children.
	if out := bashOK(t, b, `ls -d /proc/[0-9]* | wc -l; tr '\0' ' ' < /proc/1/cmdline`); !strings.Contains(out, "dsec-guest") {
		t.Errorf("b's PID 1 is not its agent: %q", out)
	} else if n := strings.Fields(out)[0]; len(n) > 1 {
		t.Errorf("b's /proc lists %s processes", n)
	}

	// Network: a listens on all its addresses; it reaches itself on its
	// sandbox address, b does not reach it.
	if _, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"perl", "-MIO::Socket::INET", "-e",
		`$s = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => 7000, Listen => 8, ReuseAddr => 1) or die "listen: $!";
		 while ($c = $s->accept) { print $c "hello from a\n"; close $c }`}}}); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(bashOK(t, a, `getent hosts "$(hostname)" | awk '{print $1}'`))
	if addr == "" || strings.HasPrefix(addr, "127.") {
		t.Fatalf("a's address from /etc/hosts: %q", addr)
	}
	probe := fmt.Sprintf(`timeout 5 bash -c 'exec 3<>/dev/tcp/%s/7000 && cat <&3'`, addr)
	// The listener may take a moment to start.
	var self api.ExecResult
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if self = bash(t, a, probe); self.ExitCode == 0 || time.Now().After(deadline) {
			break
		}
	}
	if self.ExitCode != 0 || self.Stdout != "hello from a\n" {
		t.Fatalf("a cannot reach its own listener on %s (the probe proves nothing): %+v", addr, self)
	}
	res := bash(t, b, probe)
	if res.ExitCode == 0 || strings.Contains(res.Stdout, "hello") {
		t.Errorf("b reached a's listener on %s: %+v", addr, res)
	}
	t.Logf("b connecting to a: exit %d, %s", res.ExitCode, strings.TrimSpace(res.Stderr))
}

// TestGoTestUnderExecutables: `go test` runs in a phase that allows only
// the shell, the toolchain and the build directory: go test runs test
// binaries it has just linked in its temporary build directory
// ($GOTMPDIR/go-build…/b001/pkg.test, a new name each time), so the
// phase allows that tree with "dir/**" and points GOTMPDIR at it. The
// same phase without the tree kills the test binaries (the control), and
// so does one that allows only the files directly in it ("dir/*").
func TestGoTestUnderExecutables(t *testing.T) {
	needRoot(t)
	img := realImage(t)
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	mon, rec, log := startMonitor(t)
	rt := newRuntime(t, dir, runtimeOptions{monitor: rec})
	rt.opt.Exec = mon // before any sandbox: no one reads it yet
	const gotmp = "/tmp/gotest"
	tools := []string{"/usr/bin/bash", goRoot + "/**"}
	phases := []api.Phase{
		{Name: "setup"},
		{Name: "flat", Executables: append(slices.Clone(tools), gotmp+"/*")},
		{Name: "tree", Executables: append(slices.Clone(tools), gotmp+"/**")},
	}
	ctx := context.Background()
	created, err := rt.Create(ctx, sandbox.Spec{ID: "gotest-exec", Tier: Tier, Image: img, CPU: 2, MemoryMB: 1024, DiskMB: 512, Phases: phases})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	defer sb.Destroy(ctx)
	// Build the standard library and the module once, while anything may
	// run, so the locked phases only link and run the tests.
	bashOK(t, sb, "mkdir -p "+gotmp+" && cd /workspace/hello && go vet ./... && go test ./... >/dev/null")
	goTest := "cd /workspace/hello && GOTMPDIR=" + gotmp + " go test -count=1 ./greet 2>&1"
	for _, p := range phases[1:] {
		if err := sb.SetPhase(ctx, p); err != nil {
			t.Fatalf("SetPhase(%s): %v", p.Name, err)
		}
		res := bash(t, sb, goTest)
		passed := res.ExitCode == 0 && strings.Contains(res.Stdout, "ok  \texample.com/hello/greet")
		switch {
		case p.Name == "tree" && !passed:
			t.Errorf("go test with %s/** allowed: exit %d\n%s%s", gotmp, res.ExitCode, res.Stdout, res.Stderr)
		case p.Name == "flat" && (passed || !strings.Contains(res.Stdout, "signal: killed")):
			t.Errorf("control: go test with only %s/* allowed: exit %d, want its test binary killed\n%s%s", gotmp, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	// The control's kill was audited, with the test binary's path.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		found := false
		log.mu.Lock()
		for _, e := range log.evs {
			found = found || e.Sandbox == sb.id && e.Rule == "exec-not-allowed" && e.Phase == "flat" && strings.HasPrefix(e.Path, gotmp+"/go-build") && strings.HasSuffix(e.Path, ".test")
		}
		log.mu.Unlock()
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no exec-not-allowed event for a test binary under %s in phase flat within 10s", gotmp)
			break
		}
	}
}
