//go:build linux

package cgroups

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// roleEnv makes the test binary act as a helper process (see TestMain).
const roleEnv = "DSEC_CGROUPS_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "alloc":
		allocRole()
		return
	case "threadfork":
		threadForkRole()
		return
	}
	if os.Geteuid() == 0 {
		sweepStaleTestParents()
	}
	os.Exit(m.Run())
}

// allocRole waits for a line on stdin, then allocates and touches
// $MB MiB, prints "ok" and exits 0. In a memory cgroup with a smaller
// limit the OOM killer ends it with SIGKILL first.
func allocRole() {
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	mb, _ := strconv.Atoi(os.Getenv("MB"))
	b := make([]byte, mb<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	fmt.Println("ok", len(b)>>20)
	os.Exit(0)
}

// threadForkRole is a process shaped like a sandbox's agent: its main
// thread holds $HOLD MiB, and another thread, whose id it prints first,
// runs /bin/sh -c "$CMD" once a line arrives on stdin. It prints
// "child <pid> <how it ended>", then "ok" and exits 0.
func threadForkRole() {
	runtime.LockOSThread() // the leader stays on the main thread
	hold, _ := strconv.Atoi(os.Getenv("HOLD"))
	b := make([]byte, hold<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	tids, done := make(chan int), make(chan string)
	go func() {
		runtime.LockOSThread()
		tids <- syscall.Gettid()
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		cmd := exec.Command("/bin/sh", "-c", os.Getenv("CMD"))
		err := cmd.Start()
		if err == nil {
			err = cmd.Wait()
		}
		done <- fmt.Sprintf("child %d %v", cmd.Process.Pid, err)
	}()
	// bounded: a helper process, which the test that started it kills
	fmt.Println(<-tids)
	// bounded: as above
	fmt.Println(<-done)
	fmt.Println("ok")
	runtime.KeepAlive(b)
}

const hostRoot = "/sys/fs/cgroup"

var testParentRE = regexp.MustCompile(`^dsec-test-(\d+)-`)

// sweepStaleTestParents removes what crashed earlier runs of these tests
// left: dsec-test-<pid>-… parents whose pid is gone.
func sweepStaleTestParents() {
	seen := map[string]bool{}
	for _, mnt := range hostMounts() {
		ents, _ := os.ReadDir(mnt)
		for _, e := range ents {
			sm := testParentRE.FindStringSubmatch(e.Name())
			if sm == nil || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			if _, err := os.Stat("/proc/" + sm[1]); err == nil {
				continue // that run is alive
			}
			for _, mode := range []Mode{Detect, V1} {
				if m, err := New(context.Background(), Options{Parent: e.Name(), Mode: mode}); err == nil {
					_ = m.Sweep(context.Background(), nil)
				}
			}
			removeParent(e.Name())
		}
	}
}

// hostMounts returns every cgroup hierarchy mounted under /sys/fs/cgroup.
func hostMounts() []string {
	ents, _ := os.ReadDir(hostRoot)
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(hostRoot, e.Name(), "cgroup.procs")); err == nil {
			out = append(out, filepath.Join(hostRoot, e.Name()))
		}
	}
	return out
}

func removeParent(parent string) {
	for _, mnt := range hostMounts() {
		_ = os.Remove(filepath.Join(mnt, parent))
	}
}

var parentSeq atomic.Int64

// newManager returns a Manager over a parent of its own, on the host's
// cgroups unless opt.Root says otherwise. At the end of the test it
// sweeps the parent, removes it and fails the test if anything is left
// in any hierarchy of the host.
func newManager(t testing.TB, opt Options) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroup tests need root")
	}
	if opt.Parent == "" {
		name := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-")
		opt.Parent = fmt.Sprintf("dsec-test-%d-%d-%s", os.Getpid(), parentSeq.Add(1), strings.Trim(name, "-"))
		if len(opt.Parent) > 100 {
			opt.Parent = opt.Parent[:100]
		}
	}
	m, err := New(context.Background(), opt)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := m.Sweep(ctx, nil); err != nil {
			t.Errorf("Sweep: %v", err)
		}
		for _, mnt := range m.mounts() {
			// Close removes an empty parent itself.
			if err := os.Remove(filepath.Join(mnt, opt.Parent)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("removing the test parent: %v", err)
			}
		}
		assertNoParent(t, opt.Parent)
	})
	return m
}

// assertNoParent fails the test if parent exists in any hierarchy.
func assertNoParent(t testing.TB, parent string) {
	t.Helper()
	for _, mnt := range hostMounts() {
		if _, err := os.Stat(filepath.Join(mnt, parent)); err == nil {
			t.Errorf("leftover cgroup %s", filepath.Join(mnt, parent))
		}
	}
}

// started is a process started by a test and reaped at its end.
type started struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	waited chan error
}

// start starts argv held on its stdin (helpers read a line before they
// act) and kills and reaps it when the test ends.
func start(t testing.TB, env []string, argv ...string) *started {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	startedPids.Store(cmd.Process.Pid, true)
	s := &started{cmd: cmd, stdin: in, stdout: bufio.NewReader(out), waited: make(chan error, 1)}
	go func() { s.waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case err := <-s.waited:
			s.waited <- err
		case <-time.After(reapTimeout):
			// A frozen or stuck process cannot die; fail instead of
			// hanging the package.
			_, state, _ := taskState(cmd.Process.Pid)
			t.Errorf("process %d (%s) not reaped %v after SIGKILL (state %s)", cmd.Process.Pid, strings.Join(argv, " "), reapTimeout, state)
		}
	})
	return s
}

// reapTimeout bounds the wait for a killed helper process at a test's end.
const reapTimeout = 15 * time.Second

// startedPids are the pids of the processes start started (reapOrphans
// leaves them to os/exec).
var startedPids sync.Map

// release lets a held process go on.
func (s *started) release(t testing.TB) {
	t.Helper()
	if _, err := io.WriteString(s.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

// wait waits for the process to exit.
func (s *started) wait(t testing.TB, d time.Duration) error {
	t.Helper()
	select {
	case err := <-s.waited:
		s.waited <- err
		return err
	case <-time.After(d):
		t.Fatalf("process %d still running after %v", s.cmd.Process.Pid, d)
		return nil
	}
}

// waitFor polls cond every 10 ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readTrim(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// procCgroups returns /proc/<pid>/cgroup as hierarchy (its controllers,
// or "" for cgroup2) → path.
func procCgroups(t testing.TB, pid int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(readTrim(t, fmt.Sprintf("/proc/%d/cgroup", pid)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 {
			out[f[1]] = f[2]
		}
	}
	return out
}
