package sandboxtest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

func testProcesses(t *testing.T, f Factory) {
	e := newEnv(t, f)
	sb := e.newSandbox()
	pr, ok := sb.(sandbox.ProcessRunner)
	if !e.rt.Capabilities().Processes {
		// A tier without processes must say so, naming itself.
		if ok {
			_, err := pr.StartProcess(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Cat()}})
			if !errors.Is(err, errdefs.Unsupported) {
				t.Errorf("StartProcess on a tier without processes: err = %v, want Unsupported", err)
			}
		}
		return
	}
	if !ok {
		t.Fatal("Capabilities().Processes is true but the sandbox is not a ProcessRunner")
	}
	ctx := context.Background()
	p, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Cat()}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	pid := p.Info().Pid
	if pid <= 0 || p.Info().State != api.ProcessRunning {
		t.Fatalf("Info = %+v", p.Info())
	}
	if !slices.ContainsFunc(pr.Processes(), func(x api.Process) bool { return x.Pid == pid }) {
		t.Errorf("Processes() lacks pid %d", pid)
	}
	if err := p.WriteStdin(ctx, []byte("via stdin\n")); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := p.Wait(wctx)
	if err != nil || res.ExitCode != 0 || res.Stdout != "via stdin\n" {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	p2, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Sleep(60)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Signal("KILL"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	res, err = p2.Wait(wctx)
	if err != nil || res.ExitCode != -1 || res.Error != "killed" {
		t.Errorf("killed process: %+v, %v; want exit code -1, error \"killed\"", res, err)
	}
	if _, err := pr.Process(999999); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Process(unknown): err = %v, want NotFound", err)
	}
}

func testDestroy(t *testing.T, f Factory) {
	e := newEnv(t, f)
	sb, err := e.rt.Create(context.Background(), e.spec())
	if err != nil {
		t.Fatal(err)
	}
	write(t, sb.Files(), work("f"), "x", sandbox.WriteOptions{})
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Echo("x"), TimeoutS: 5}}); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Exec after Destroy: err = %v, want NotFound", err)
	}
	if _, err := sb.Files().Stat(context.Background(), work("f")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Stat after Destroy: err = %v, want NotFound", err)
	}
	// A second sandbox with the same ID starts clean.
	spec := e.spec()
	spec.ID = sb.ID()
	sb2 := e.create(spec)
	if _, err := sb2.Files().Stat(context.Background(), work("f")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("file survived Destroy into a new sandbox with the same ID: %v", err)
	}
}

func testRecover(t *testing.T, f Factory) {
	dir := t.TempDir()
	rt := f.New(t, dir)
	if got, err := rt.Recover(context.Background()); err != nil || len(got) != 0 {
		t.Fatalf("Recover on an empty state dir = %d sandboxes, %v", len(got), err)
	}
	spec := sandbox.Spec{ID: sandboxID(t, 9000), Tier: rt.Tier(), Image: f.Image, CPU: 1, MemoryMB: 256, DiskMB: 64}
	sb, err := rt.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	write(t, sb.Files(), work("kept.txt"), "still here", sandbox.WriteOptions{})
	if err := rt.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	rt2 := f.New(t, dir)
	defer rt2.Close(context.Background())
	got, err := rt2.Recover(context.Background())
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(got) != 1 || got[0].ID() != spec.ID {
		t.Fatalf("Recover returned %d sandboxes, want 1 with ID %s", len(got), spec.ID)
	}
	sb2 := got[0]
	defer sb2.Destroy(context.Background())
	if got := readAll(t, sb2.Files(), work("kept.txt")); got != "still here" {
		t.Errorf("recovered file = %q", got)
	}
	if res := run(t, sb2, api.ExecRequest{Cmd: f.Commands.Echo("recovered")}); res.Stdout != "recovered\n" {
		t.Errorf("exec in recovered sandbox: %+v", res)
	}
}
