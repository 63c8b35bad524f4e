package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestMain makes the test binary act as dsec-guest when asked to, so the
// tests run the real main without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("DSEC_GUEST_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// guest returns a command running dsec-guest with args.
func guestCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// atexit_sleep_ms: the race runtime otherwise sleeps 1 s at each exit.
	cmd.Env = append(os.Environ(), "DSEC_GUEST_TEST_MAIN=1", "GORACE=atexit_sleep_ms=0")
	return cmd
}

func run(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := guestCmd(t, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		status = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("dsec-guest %q killed by %v", args, ws.Signal())
		}
	default:
		t.Fatalf("running dsec-guest %q: %v", args, err)
	}
	return out.String(), errb.String(), status
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		status     int
		stdout     string // a prefix
		stderrPart string
	}{
		{name: "version", args: []string{"version"}, stdout: "dsec-guest dev\n"},
		{name: "help", args: []string{"--help"}, stdout: "dsec-guest: DSec's in-sandbox agent."},
		{name: "no args", args: nil, status: 2, stderrPart: "Usage:"},
		{name: "unknown", args: []string{"frobnicate"}, status: 2, stderrPart: `unknown command "frobnicate"`},
		{name: "init without command", args: []string{"init", "--"}, status: 2, stderrPart: "no command"},
		{name: "exit status", args: []string{"init", "--", "/bin/sh", "-c", "exit 3"}, status: 3},
		{name: "no dashes", args: []string{"init", "sh", "-c", "echo out; exit 0"}, stdout: "out\n"},
		{name: "killed by signal", args: []string{"init", "--", "/bin/sh", "-c", "kill -KILL $$"}, status: 128 + 9},
		{name: "not found", args: []string{"init", "--", "/nonexistent/cmd"}, status: 127, stderrPart: "nonexistent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, status := run(t, tc.args...)
			if status != tc.status {
				t.Errorf("status %d, want %d (stderr %q)", status, tc.status, stderr)
			}
			if !strings.HasPrefix(stdout, tc.stdout) {
				t.Errorf("stdout %q, want prefix %q", stdout, tc.stdout)
			}
			if !strings.Contains(stderr, tc.stderrPart) {
				t.Errorf("stderr %q, want it to contain %q", stderr, tc.stderrPart)
			}
		})
	}
}

// TestForwardsSignals checks that a SIGTERM sent to the guest reaches the
// command, whose trap decides the exit status.
func TestForwardsSignals(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := guestCmd(t, "init", "--", "/bin/sh", "-c", `trap 'exit 7' TERM; touch `+ready+`; while :; do sleep 0.05; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command to start", func() bool { return exists(ready) })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := testenv.WaitCmd(t, cmd, time.Minute, "the guest to exit on SIGTERM")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("guest ended with %v, want exit status 7", err)
	}
}

// TestReapsOrphans starts a command whose child leaves a background
// process behind and exits. The orphan must be reparented to the guest
// (a child subreaper, standing in for PID 1) and, once it exits, reaped:
// no zombie is left while the command still runs.
func TestReapsOrphans(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "orphan")
	script := `sh -c 'sleep 0.5 & echo $! > ` + pidFile + `.tmp; mv ` + pidFile + `.tmp ` + pidFile + `'; sleep 2; exit 5`
	cmd := guestCmd(t, "init", "--", "/bin/sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guestPid := cmd.Process.Pid
	var orphan int
	waitFor(t, "the orphan's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		orphan, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	// Reparented to the guest once its parent shell exits…
	reparented := false
	waitFor(t, "the orphan to be reaped", func() bool {
		st, ok := procStatus(orphan)
		if !ok {
			return true // gone: reaped
		}
		if st["PPid"] == strconv.Itoa(guestPid) {
			reparented = true
		}
		return false
	})
	if !reparented {
		t.Errorf("orphan %d was never seen reparented to the guest %d", orphan, guestPid)
	}
	// …and nothing of the guest's is a zombie while the command runs.
	for _, pid := range children(t, guestPid) {
		if st, ok := procStatus(pid); ok && strings.HasPrefix(st["State"], "Z") {
			t.Errorf("zombie child %d of the guest: %v", pid, st)
		}
	}
	err := testenv.WaitCmd(t, cmd, time.Minute, "the guest to exit")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Fatalf("guest ended with %v, want exit status 5", err)
	}
}

// procStatus returns the fields of /proc/pid/status, and false if the
// process does not exist.
func procStatus(pid int) (map[string]string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, false
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, true
}

// children lists the processes whose parent is pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStatus(p); ok && st["PPid"] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
