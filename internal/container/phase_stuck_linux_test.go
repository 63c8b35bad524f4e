package container

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestPhaseAndDestroyStuck changes the phase of, and destroys, a sandbox
// with many processes while every core is busy and one of its tasks is
// in uninterruptible sleep (a host process, stuck on a FUSE request
// nobody answers, moved into the sandbox's cgroup: nothing inside a
// container can reach such a file system). Each call must end in time
// with the sandbox either running, thawed and usable, or gone, and say
// which: before, a freeze that timed out left the sandbox frozen for
// good.
func TestPhaseAndDestroyStuck(t *testing.T) {
	dir := t.TempDir()
	nm, _ := names(dir)
	t.Cleanup(func() {
		checkHost(t, dir)
		noSandboxProcs(t, nm)
	})
	rt := newRuntime(t, dir, runtimeOptions{pool: 1, phaseTimeout: 5 * time.Second})
	ctx := context.Background()
	for range runtime.NumCPU() {
		hog := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := hog.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = hog.Process.Kill()
			_ = testenv.WaitCmd(t, hog, time.Minute, "the CPU hog to exit after SIGKILL")
		})
	}
	phases := []api.Phase{{Name: "setup"}, {Name: "coding", Writable: []string{"/tmp"}}}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "stuck", Image: world.image(), Phases: phases})
	if err != nil {
		t.Fatal(err)
	}
	sb := created.(*Sandbox)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_ = sb.Destroy(ctx)
		}
	})
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`for i in $(seq 100); do (sleep 1000 >/dev/null 2>&1 &); done; echo ok`)}})
	if err != nil || res.Stdout != "ok\n" {
		t.Fatalf("starting 100 processes: %+v, %v", res, err)
	}
	fuse := testenv.NewStuckFUSE(t)
	stuck := exec.Command("/bin/sh", "-c", "read x; exec stat "+fuse.Dir+"/x")
	in, _ := stuck.StdinPipe()
	if err := stuck.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan error, 1)
	go func() { reaped <- stuck.Wait() }()
	t.Cleanup(func() {
		fuse.Release()
		_ = stuck.Process.Kill()
		select {
		case <-reaped:
		case <-time.After(15 * time.Second):
			t.Errorf("the stuck stat (pid %d) was not reaped 15 s after the FUSE release", stuck.Process.Pid)
		}
	})
	if err := sb.cg.AddProc(stuck.Process.Pid); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(in, "go")
	if !fuse.WaitRequest(10 * time.Second) {
		t.Fatal("the stat's request did not reach the FUSE server in 10 s")
	}

	// The phase change cannot stop the stuck task: it gives up, and the
	// sandbox runs on in its old phase.
	began := time.Now()
	err = sb.SetPhase(ctx, phases[1])
	took := time.Since(began)
	if errdefs.CodeOf(err) != "phase_change_busy" || errdefs.ClassOf(err) != errdefs.Unavailable {
		t.Fatalf("SetPhase with a stuck task = %v (code %q), want unavailable phase_change_busy", err, errdefs.CodeOf(err))
	}
	if !strings.Contains(err.Error(), "still running in phase setup") || !strings.Contains(err.Error(), "(stat, in ") {
		t.Errorf("SetPhase's error does not say the sandbox runs on, or which task is stuck: %v", err)
	}
	if took > 20*time.Second {
		t.Errorf("SetPhase took %v to give up (its bound is 5 s)", took)
	}
	if sb.cg.Frozen() {
		t.Fatal("a phase change that gave up left the sandbox frozen")
	}
	if sb.Phase() != "setup" {
		t.Errorf("phase after a change that gave up: %q", sb.Phase())
	}
	res, err = sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`touch /etc/still-setup && echo ok`)}})
	if err != nil || res.Stdout != "ok\n" {
		t.Errorf("exec after a change that gave up: %+v, %v", res, err)
	}

	// A destroy cannot end it either: it says so and keeps the sandbox
	// for a later destroy.
	err = sb.Destroy(ctx)
	if errdefs.CodeOf(err) != "destroy_incomplete" || errdefs.ClassOf(err) != errdefs.Unavailable {
		t.Fatalf("Destroy with a stuck task = %v, want unavailable destroy_incomplete", err)
	}
	if sb.cg.Frozen() {
		t.Error("a destroy that gave up left the sandbox frozen")
	}
	// Once the task can go on, the next destroy finishes.
	fuse.Release()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy after the release: %v", err)
	}
	destroyed = true
	select {
	case err := <-reaped:
		if err == nil {
			t.Error("the stuck stat exited 0")
		}
		reaped <- err
	case <-time.After(15 * time.Second):
		t.Error("the stuck stat was not reaped after the destroy")
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`true`)}}); !errors.Is(err, errdefs.NotFound) && err == nil {
		t.Errorf("exec after the destroy: %v", err)
	}
}
