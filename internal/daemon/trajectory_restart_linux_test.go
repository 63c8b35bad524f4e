package daemon

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestTrajectorySurvivesCrashAndRestart streams recorded execs into
// three sandboxes of a `dsec up` (a child process, with its embedded
// NATS server) that is killed -9 midway. After the restart every exec
// the API acknowledged is in its trajectory, in order, with its output
// (at most the one in flight is logged beyond them). The sandbox ID
// keeps working and its next step follows the last logged one; a clean
// restart after that keeps the log as it was.
func TestTrajectorySurvivesCrashAndRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Defaults()
	cfg.DataDir, cfg.API.Listen, cfg.NATS.Listen, cfg.Node.ID = dir, "127.0.0.1:0", "none", "test-node"
	cfg.Container.Disabled, cfg.MicroVM.Disabled, cfg.VM.Disabled = true, true, true
	cfg.Images.BuiltinCache, cfg.Images.SkipSlow, cfg.Node.FunctionCacheDir = builtinCache, true, wasmCache
	d := startProcDaemon(t, cfg)
	ctx := context.Background()

	const streams = 3
	ids, trajs := make([]string, streams), make([]string, streams)
	for i := range streams {
		trajs[i] = fmt.Sprintf("crash/stream-%d", i)
		sb, err := d.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Trajectory: trajs[i], ResumeOnPreempt: true})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = sb.ID
	}
	// acked[i] are the outputs of stream i's acknowledged execs, in order;
	// only its goroutine writes it until wg is done.
	acked := make([][]string, streams)
	wrong := make([]string, streams)
	var total atomic.Int64
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				want := fmt.Sprintf("%d-%d", i, n)
				res, err := d.c.Exec(ctx, ids[i], api.ExecRequest{Cmd: []string{"echo", want}})
				if err != nil {
					return // the daemon is gone
				}
				if res.Stdout != want+"\n" {
					wrong[i] = fmt.Sprintf("exec %q answered %+v", want, res)
					return
				}
				acked[i] = append(acked[i], want)
				total.Add(1)
			}
		}()
	}
	testenv.Eventually(t, 2*time.Minute, "90 acknowledged execs", func() bool { return total.Load() >= 90 })
	d.kill()
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the clients to see the daemon gone")
	for i := range streams {
		if wrong[i] != "" {
			t.Fatal(wrong[i])
		}
	}

	u := startUp(t, dir, nil)
	logged := make([]int, streams) // each trajectory's last step
	for i := range streams {
		outs, last := loggedEchoes(t, u.c, trajs[i])
		n := len(acked[i])
		if len(outs) < n || len(outs) > n+1 {
			t.Errorf("%s: %d execs logged, %d acknowledged (want the acknowledged, and at most the one in flight)", trajs[i], len(outs), n)
		}
		for k, out := range outs {
			if want := fmt.Sprintf("%d-%d\n", i, k); out != want {
				t.Errorf("%s: exec %d logged output %q, want %q", trajs[i], k, out, want)
				break
			}
		}
		logged[i] = last
		t.Logf("%s: %d execs acknowledged before the kill, %d logged", trajs[i], n, len(outs))
	}
	// The same sandbox IDs carry on, their next steps after the log's.
	for i := range streams {
		waitRunning(t, u.c, ids[i])
		if err := execOK(ctx, u.c, ids[i], api.ExecRequest{Cmd: []string{"echo", "after"}}); err != nil {
			t.Fatalf("exec in %s after the crash: %v", ids[i], err)
		}
		page, err := u.c.TrajectorySteps(ctx, trajs[i], logged[i], 100)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(page.Steps); n == 0 || page.Steps[n-1].Kind != api.KindExec || page.Steps[n-1].Exec.Stdout != "after\n" {
			t.Errorf("%s after step %d: %+v, want the new exec last", trajs[i], logged[i], page.Steps)
		}
	}

	// A clean restart keeps every step.
	before := make([]string, streams)
	for i := range streams {
		before[i] = exportString(t, u.c, trajs[i])
	}
	u.stop()
	u = startUp(t, dir, nil)
	for i := range streams {
		// A stop ends the sandboxes of `dsec up`: their logs gain that end.
		got := exportString(t, u.c, trajs[i])
		rest, ok := strings.CutPrefix(got, before[i])
		if !ok {
			t.Errorf("%s changed across a clean restart:\n%s\nwant a continuation of\n%s", trajs[i], got, before[i])
			continue
		}
		steps, err := client.ReadTrajectoryExport(strings.NewReader(rest))
		if err != nil || len(steps) != 1 || steps[0].Kind != api.KindEnd {
			t.Errorf("%s gained %q across a clean restart, want only its end", trajs[i], rest)
		}
		if err := u.c.DeleteSandbox(ctx, ids[i]); err != nil {
			t.Error(err)
		}
	}
	u.stop()
	testenv.NoMountsUnder(t, dir)
}

// loggedEchoes are the stdouts of traj's logged `echo` execs, in order,
// and its last step.
func loggedEchoes(t *testing.T, c *client.Client, traj string) ([]string, int) {
	t.Helper()
	page, err := c.TrajectorySteps(context.Background(), traj, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var outs []string
	last := 0
	for _, st := range page.Steps {
		last = st.Step
		if st.Kind == api.KindExec && len(st.Exec.Request.Cmd) > 0 && st.Exec.Request.Cmd[0] == "echo" {
			outs = append(outs, st.Exec.Stdout)
		}
	}
	return outs, last
}

// exportString is traj's JSONL export.
func exportString(t *testing.T, c *client.Client, traj string) string {
	t.Helper()
	var b strings.Builder
	if err := c.ExportTrajectory(context.Background(), traj, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// waitRunning waits until sandbox id runs (after a restart it may be
// re-adopted, or resumed from its trajectory).
func waitRunning(t *testing.T, c *client.Client, id string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "sandbox "+id+" to run", func() bool {
		sb, err := c.GetSandbox(context.Background(), id)
		return err == nil && sb.State == api.StateRunning
	})
}
