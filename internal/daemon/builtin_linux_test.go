package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// fakeSeq numbers fakeDebootstrap's markers.
var fakeSeq atomic.Int64

// fakeDebootstrap puts first on PATH a stand-in for debootstrap that does,
// in a second, what makes an interrupted debian-12 build dangerous: it
// mounts proc in the tree it fills, as the real one mounts /proc and /sys
// there, starts a child that ignores SIGTERM, as a chrooted dpkg runs on
// when debootstrap is killed, leaves a file in the tree once mounted,
// and waits. Its processes carry the marker returned on their command
// lines. The test's cleanup kills any of them left and detaches what
// they left mounted under dir (the data directory) in the host's table,
// so that a failure does not leak.
func fakeDebootstrap(t *testing.T, dir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the debian-12 build runs as root (it mounts)")
	}
	marker := fmt.Sprintf("dsec-fake-debootstrap-%d-%d", os.Getpid(), fakeSeq.Add(1))
	bin := filepath.Join(t.TempDir(), marker)
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
set -e
target="$3"
mkdir -p "$target/proc"
mount -t proc proc "$target/proc"
sh -c 'trap "" TERM; while :; do sleep 1; done' ` + marker + `-child &
touch "$target/.fake-debootstrap-mounted"
while :; do sleep 1; done
`
	if err := os.WriteFile(filepath.Join(bin, "debootstrap"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	t.Cleanup(func() {
		for _, p := range markedProcs(marker) {
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		}
		testenv.UnmountAll(dir)
	})
	return marker
}

// markedProcs lists the processes whose command line holds marker.
func markedProcs(marker string) []testenv.Proc {
	var out []testenv.Proc
	for _, p := range testenv.Procs() {
		if strings.Contains(p.Cmdline, marker) {
			out = append(out, p)
		}
	}
	return out
}

// buildTemps lists the temporary directories of debian-12 builds in the
// built-in layer cache cache.
func buildTemps(cache string) []string {
	dirs, _ := filepath.Glob(filepath.Join(cache, "base", "debian-12", ".*.tmp-*"))
	return dirs
}

// waitBuildMounted waits until the stand-in debootstrap has mounted proc
// in a build's tree under cache.
func waitBuildMounted(t *testing.T, cache string, quit <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for _, d := range buildTemps(cache) {
			if _, err := os.Stat(filepath.Join(d, "tree", ".fake-debootstrap-mounted")); err == nil {
				return
			}
		}
		select {
		case <-quit:
			t.Fatal("the daemon exited before the debian-12 build mounted anything")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the background debian-12 build did not start (no mounted tree after 2 minutes)")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noBuildLeftovers fails the test if anything of an interrupted build
// is left: processes, mounts under dir in the host's table, or its
// temporary tree.
func noBuildLeftovers(t *testing.T, marker, dir, cache string) {
	t.Helper()
	// A killed process's children are reaped by the kernel at once; give
	// the exits a moment.
	deadline := time.Now().Add(5 * time.Second)
	for len(markedProcs(marker)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if ps := markedProcs(marker); len(ps) > 0 {
		t.Errorf("build processes left: %v", ps)
	}
	if m := testenv.Mounts(t, dir); len(m) > 0 {
		t.Errorf("mounted under the data directory: %q", m)
	}
	if tmps := buildTemps(cache); len(tmps) > 0 {
		t.Errorf("the build's temporary tree is left: %v", tmps)
	}
}

// TestStopEndsTheDebianBuild stops `dsec up` while its background
// debian-12 build has proc mounted in its tree and a child that ignores
// SIGTERM: the build's mounts never show in the host's mount table, and
// by the time Run returns the build's processes are gone and its tree
// removed, so that an `rm -rf` of the data directory cannot reach the
// host's /proc.
func TestStopEndsTheDebianBuild(t *testing.T) {
	dir := t.TempDir()
	marker := fakeDebootstrap(t, dir)
	cache := filepath.Join(dir, "builtin")
	u := startUp(t, dir, func(c *config.Config) {
		c.Images.SkipSlow = false
		c.Images.BuiltinCache = cache
	})
	waitBuildMounted(t, cache, nil)
	if m := testenv.Mounts(t, cache); len(m) > 0 {
		t.Errorf("the build's mounts show in the host's mount table: %q", m)
	}

	start := time.Now()
	u.cancel()
	u.cancel = nil
	select {
	case err := <-u.done:
		if err != nil {
			t.Errorf("dsec up: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("dsec up did not stop within 30 s of its shutdown, the build running (processes: %v)", markedProcs(marker))
	}
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	noBuildLeftovers(t, marker, dir, cache)
}

// TestKilledDuringTheDebianBuild kills -9 a `dsec up` process while its
// background debian-12 build has proc mounted in its tree: the build's
// processes die with it and its mounts with them (none ever shows in the
// host's table), and the next start removes its temporary tree.
func TestKilledDuringTheDebianBuild(t *testing.T) {
	dir := t.TempDir()
	marker := fakeDebootstrap(t, dir)
	cache := filepath.Join(dir, "builtin")
	cfg := config.Defaults()
	cfg.DataDir, cfg.API.Listen, cfg.NATS.Listen, cfg.Node.ID = dir, "127.0.0.1:0", "none", "test-node"
	cfg.Container.Disabled, cfg.MicroVM.Disabled = true, true
	cfg.Images.BuiltinCache = cache
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DSEC_TEST_DAEMON="+string(raw))
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Kill()
		testenv.Recv(t, exited, time.Minute, "the daemon to exit after SIGKILL")
		if t.Failed() {
			t.Logf("the killed daemon's log:\n%s", logs.String())
		}
	}()
	waitBuildMounted(t, cache, exited)
	if m := testenv.Mounts(t, cache); len(m) > 0 {
		t.Errorf("the build's mounts show in the host's mount table: %q", m)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, exited, time.Minute, "the daemon to exit after SIGKILL")
	// The tree stays until the next start; nothing else may.
	if len(buildTemps(cache)) == 0 {
		t.Fatal("no build tree after the kill: the test checks nothing")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(markedProcs(marker)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if ps := markedProcs(marker); len(ps) > 0 {
		t.Errorf("build processes outlived the node: %v", ps)
	}
	// (The node's own mounts stay for the next start to take over.)
	if m := testenv.Mounts(t, cache); len(m) > 0 {
		t.Errorf("mounted in the build's tree with no dsec process running: %q", m)
	}

	u := startUp(t, dir, func(c *config.Config) { c.Images.BuiltinCache = cache })
	u.stop()
	noBuildLeftovers(t, marker, dir, cache)
}
