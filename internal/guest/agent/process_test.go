//go:build linux

package agent_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// procState returns the state letter of /proc/pid/stat.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func TestBackgroundLifecycle(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	ctx := ctxT(t, 60*time.Second)
	ready := filepath.Join(t.TempDir(), "ready")
	p, err := c.Start(ctx, agentproto.ExecRequest{
		Argv: sh(`trap 'echo got-term; exit 7' TERM; echo ready; touch "$1"; while :; do sleep 0.05; done`, ready),
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid <= 0 || p.State != api.ProcessRunning || p.Cmd[0] != "/bin/sh" || p.StartedAt.IsZero() {
		t.Fatalf("Start = %+v", p)
	}
	list, err := c.Processes(ctx)
	if err != nil || !slices.ContainsFunc(list, func(x api.Process) bool { return x.Pid == p.Pid && x.State == api.ProcessRunning }) {
		t.Fatalf("Processes = %+v, %v", list, err)
	}

	// Attach from now on: after "ready".
	waitFor(t, "ready", func() bool { _, err := os.Stat(ready); return err == nil })
	var (
		attached bytes.Buffer
		amu      sync.Mutex
	)
	attachDone := make(chan api.ExecResult, 1)
	go func() {
		res, err := c.Attach(ctx, p.Pid, agentproto.Output{Stdout: func(b []byte) {
			amu.Lock()
			attached.Write(b)
			amu.Unlock()
		}})
		if err != nil {
			t.Errorf("Attach: %v", err)
		}
		attachDone <- res
	}()

	if err := c.Signal(ctx, p.Pid, "STOP"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the process to stop", func() bool { return procState(p.Pid) == "T" })
	if err := c.Signal(ctx, p.Pid, "SIGCONT"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the process to continue", func() bool { return procState(p.Pid) != "T" })
	if err := c.Signal(ctx, p.Pid, "BOGUS"); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("unknown signal: err = %v, want Invalid", err)
	}
	time.Sleep(100 * time.Millisecond) // let Attach subscribe
	if err := c.Signal(ctx, p.Pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	res, err := c.Wait(ctx, p.Pid)
	if err != nil || res.ExitCode != 7 || res.Stdout != "ready\ngot-term\n" {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	if again, err := c.Wait(ctx, p.Pid); err != nil || again.Stdout != res.Stdout {
		t.Errorf("second Wait = %+v, %v", again, err)
	}
	ares := testenv.Recv(t, attachDone, time.Minute, "the attached reader to end")
	amu.Lock()
	got := attached.String()
	amu.Unlock()
	if ares.ExitCode != 7 || got != "got-term\n" {
		t.Errorf("Attach = %+v with output %q", ares, got)
	}
	info, err := c.Process(ctx, p.Pid)
	if err != nil || info.State != api.ProcessExited || info.ExitCode == nil || *info.ExitCode != 7 {
		t.Errorf("Process after exit = %+v, %v", info, err)
	}
	if err := c.Signal(ctx, p.Pid, "KILL"); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("signal after exit: err = %v, want Conflict", err)
	}
	if _, err := c.Process(ctx, 999999); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("unknown pid: err = %v", err)
	}
	if _, err := c.Wait(ctx, 999999); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Wait unknown pid: err = %v", err)
	}
}

func TestBackgroundStdin(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	ctx := ctxT(t, 60*time.Second)
	p, err := c.Start(ctx, agentproto.ExecRequest{Argv: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: more than a pipe holds
	for _, chunk := range [][]byte{[]byte("one\n"), big, []byte("two\n")} {
		if err := c.WriteStdin(ctx, p.Pid, chunk); err != nil {
			t.Fatalf("WriteStdin: %v", err)
		}
	}
	if err := c.CloseStdin(ctx, p.Pid); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, p.Pid); err != nil {
		t.Errorf("second CloseStdin: %v", err)
	}
	if err := c.WriteStdin(ctx, p.Pid, []byte("late")); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("write after close: err = %v, want Conflict", err)
	}
	res, err := c.Wait(ctx, p.Pid)
	if err != nil || res.ExitCode != 0 || res.Stdout != "one\n"+string(big)+"two\n" {
		t.Fatalf("Wait: exit %d, %d bytes, %v", res.ExitCode, len(res.Stdout), err)
	}
	if err := c.WriteStdin(ctx, 999999, []byte("x")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("unknown pid: err = %v", err)
	}

	// A stdin string is written and closed.
	p, err = c.Start(ctx, agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: "given\n"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Wait(ctx, p.Pid); err != nil || res.Stdout != "given\n" {
		t.Errorf("stdin string: %+v, %v", res, err)
	}
}

// TestWriteStdinNotRead: a write to a process that does not read ends
// with the caller's context.
func TestWriteStdinNotRead(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	p, err := c.Start(ctxT(t, 10*time.Second), agentproto.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = c.WriteStdin(ctxT(t, 500*time.Millisecond), p.Pid, make([]byte, 4<<20))
	if !errors.Is(err, errdefs.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	// The process and the connection are fine; another write fails fast
	// only if the pipe is still full.
	if err := c.Signal(ctxT(t, 5*time.Second), p.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Wait(ctxT(t, 10*time.Second), p.Pid); err != nil || res.Error != "killed" || res.ExitCode != -1 {
		t.Errorf("Wait = %+v, %v", res, err)
	}
}

func TestBackgroundTimeoutAndCap(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	p, err := c.Start(ctx, agentproto.ExecRequest{Argv: []string{"yes"}, MaxOutputBytes: 1000, TimeoutS: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Wait(ctx, p.Pid)
	if err != nil || !res.TimedOut || res.ExitCode != -1 || len(res.Stdout) != 1000 || !res.StdoutTruncated {
		t.Errorf("Wait = exit %d timedOut %v, %d bytes truncated %v, %v", res.ExitCode, res.TimedOut, len(res.Stdout), res.StdoutTruncated, err)
	}
}

// TestProcessesAcrossConnections: background processes belong to the
// agent, not the connection: a new connection (a restarted node service)
// sees and waits for them.
func TestProcessesAcrossConnections(t *testing.T) {
	c, r := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	p, err := c.Start(ctx, agentproto.ExecRequest{Argv: sh("read x; echo got $x")})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c2 := dial(t, r.socket)
	defer c2.Close()
	list, err := c2.Processes(ctx)
	if err != nil || len(list) != 1 || list[0].Pid != p.Pid {
		t.Fatalf("Processes on a new connection = %+v, %v", list, err)
	}
	if err := c2.WriteStdin(ctx, p.Pid, []byte("it\n")); err != nil {
		t.Fatal(err)
	}
	if res, err := c2.Wait(ctx, p.Pid); err != nil || res.Stdout != "got it\n" {
		t.Errorf("Wait = %+v, %v", res, err)
	}
}
