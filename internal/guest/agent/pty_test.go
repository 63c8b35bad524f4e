//go:build linux

package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
)

func skipWithoutPTY(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skipf("no /dev/ptmx: %v", err)
	}
}

func TestPTYExec(t *testing.T) {
	skipWithoutPTY(t)
	c, _ := newAgent(t, agent.Options{})
	res := run(t, c, agentproto.ExecRequest{
		Argv: sh("tty; stty size; echo to-stderr >&2; echo $TERM"),
		PTY:  &agentproto.PTYSize{Rows: 33, Cols: 101},
	})
	out := strings.ReplaceAll(res.Stdout, "\r\n", "\n")
	if res.ExitCode != 0 || !strings.HasPrefix(out, "/dev/pts/") || !strings.Contains(out, "\n33 101\n") {
		t.Errorf("PTY exec: %+v", res)
	}
	if !strings.Contains(out, "to-stderr\n") || res.Stderr != "" {
		t.Errorf("stderr is not merged into the terminal: %+v", res)
	}
	if !strings.Contains(out, "xterm-256color") {
		t.Errorf("no TERM on a terminal: %q", out)
	}
	// Without a PTY there is no terminal.
	if res := run(t, c, agentproto.ExecRequest{Argv: []string{"tty"}}); res.ExitCode == 0 {
		t.Errorf("tty without a PTY: %+v", res)
	}
}

func TestPTYResize(t *testing.T) {
	skipWithoutPTY(t)
	c, _ := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	first := filepath.Join(t.TempDir(), "size")
	p, err := c.Start(ctx, agentproto.ExecRequest{
		Argv: sh(`stty size > "$1.tmp"; mv "$1.tmp" "$1"; read line; stty size; echo line=$line`, first),
		PTY:  &agentproto.PTYSize{Rows: 24, Cols: 80},
	})
	if err != nil {
		t.Fatal(err)
	}
	var size []byte
	waitFor(t, "the first stty", func() bool {
		size, err = os.ReadFile(first)
		return err == nil
	})
	if string(size) != "24 80\n" {
		t.Errorf("initial size %q", size)
	}
	if err := c.Resize(ctx, p.Pid, 50, 120); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, p.Pid, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Wait(ctx, p.Pid)
	out := strings.ReplaceAll(res.Stdout, "\r\n", "\n")
	if err != nil || !strings.Contains(out, "50 120\nline=go\n") {
		t.Errorf("Wait = %q, %v", out, err)
	}
	if err := c.Resize(ctx, p.Pid, 0, 10); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("zero rows: err = %v", err)
	}

	// CloseStdin on a terminal sends end-of-file.
	p, err = c.Start(ctx, agentproto.ExecRequest{Argv: []string{"cat"}, PTY: &agentproto.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, p.Pid, []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, p.Pid); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Wait(ctx, p.Pid); err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "hi") {
		t.Errorf("cat on a PTY after ^D: %+v, %v", res, err)
	}

	// A process without a terminal cannot be resized.
	p, err = c.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "10"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, p.Pid, 10, 10); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("resize without a PTY: err = %v", err)
	}
	c.Signal(ctx, p.Pid, "KILL")
	c.Wait(ctx, p.Pid)
}
