package daemon

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// modelPause is the inference time an agent spends before each step: the
// original rollout's wall time counts it, a resume does not wait for it.
const modelPause = 2 * time.Second

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkTrajectory measures, in one `dsec up` with the container tier
// and debian-12, side by side: what recording costs (exec p50 and the
// function tier's create → exec → delete, recorded and not, alternated),
// resume of the 40-step rollout from scratch and from its step-20
// snapshot against the original's wall time with a 2 s model pause per
// step, fork(16) of a sandbox with a 10 MB writable layer, and snapshots
// of a 100 MB writable layer and of a 1 MB change after it, each a
// sub-benchmark (-bench 'Trajectory/logging' runs one). With -short
// (make bench-smoke) every part runs at a small size, to show it runs.
func BenchmarkTrajectory(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the container tier needs root")
	}
	dir := containerDataDir(b)
	u := startUp(b, dir, func(c *config.Config) {
		withContainers(b)(c)
		c.Images.SkipSlow = false
		c.Container.NetworkPool = 0
		// A side-by-side baseline: DSEC_BENCH_WARM_AGENTS=-1 forks
		// without idle agents.
		if n, err := strconv.Atoi(os.Getenv("DSEC_BENCH_WARM_AGENTS")); err == nil {
			c.Container.WarmAgents = n
		}
	})
	waitImage(b, u.c, "debian-12", 10*time.Minute)
	ctx := context.Background()
	c := u.c
	for _, part := range []struct {
		name string
		run  func(context.Context, *testing.B, *client.Client)
	}{{"logging", benchLogging}, {"resume", benchResume}, {"fork", benchFork}, {"snapshot", benchSnapshot}} {
		b.Run(part.name, func(b *testing.B) {
			for range b.N {
				part.run(ctx, b, c)
			}
		})
	}
}

// benchLogging alternates recorded and unrecorded work in blocks, so
// that both see the same machine.
func benchLogging(ctx context.Context, b *testing.B, c *client.Client) {
	blocks, per := 10, 40
	if testing.Short() {
		blocks, per = 2, 3
	}
	var plain, rec time.Duration
	n := 0
	var made []string // deleted after the timed blocks
	// Block -1 is a warm-up of both, not timed: the first recorded
	// cycles of a fresh server made its trajectory streams' first writes
	// (the first exec took ~280 ms), which a throughput over 400 cycles
	// counted against recording.
	for blk := -1; blk < blocks; blk++ {
		for _, recorded := range []bool{blk%2 == 0, blk%2 != 0} {
			start := time.Now()
			for i := range per {
				req := api.CreateSandboxRequest{Tier: api.TierFunction}
				if recorded {
					req.Trajectory = fmt.Sprintf("bench/log/%d-%d-%d", time.Now().UnixNano(), blk, i)
				}
				sb, err := c.CreateSandbox(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}}); err != nil {
					b.Fatal(err)
				}
				if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
					b.Fatal(err)
				}
				if recorded {
					made = append(made, req.Trajectory)
				}
			}
			switch {
			case blk < 0:
			case recorded:
				rec += time.Since(start)
			default:
				plain += time.Since(start)
			}
		}
		if blk >= 0 {
			n += per
		}
	}
	for _, traj := range made {
		_ = c.DeleteTrajectory(ctx, traj) // one still ending is left to retention
	}
	plainRate, recRate := float64(n)/plain.Seconds(), float64(n)/rec.Seconds()
	b.ReportMetric(plainRate, "cycles/s-plain")
	b.ReportMetric(recRate, "cycles/s-recorded")
	b.ReportMetric(100*(plainRate-recRate)/plainRate, "cycle-overhead-%")

	// Exec p50 in a container sandbox, recorded and not, interleaved.
	mk := func(traj string) string {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "debian-12", Trajectory: traj})
		if err != nil {
			b.Fatal(err)
		}
		return sb.ID
	}
	p, r := mk(""), mk(fmt.Sprintf("bench/exec-%d", time.Now().UnixNano()))
	var dp, dr []time.Duration
	execs := 600
	if testing.Short() {
		execs = 10
	}
	for i := range execs {
		for _, id := range []string{p, r} {
			if i%2 == 1 {
				id = map[string]string{p: r, r: p}[id]
			}
			start := time.Now()
			if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
			if id == p {
				dp = append(dp, time.Since(start))
			} else {
				dr = append(dr, time.Since(start))
			}
		}
	}
	b.ReportMetric(ms(pct(dp, 0.5)), "exec-p50-ms-plain")
	b.ReportMetric(ms(pct(dr, 0.5)), "exec-p50-ms-recorded")
	b.ReportMetric(100*(ms(pct(dr, 0.5))-ms(pct(dp, 0.5)))/ms(pct(dp, 0.5)), "exec-p50-overhead-%")
	b.Logf("logging: create→exec→delete %.0f/s plain, %.0f/s recorded; container exec p50 %.2f ms plain, %.2f ms recorded",
		plainRate, recRate, ms(pct(dp, 0.5)), ms(pct(dr, 0.5)))
	for _, id := range []string{p, r} {
		_ = c.DeleteSandbox(ctx, id)
	}
}

// benchResume runs the 40-step rollout once, recorded, with a snapshot
// at step 20, then resumes it from scratch and from the snapshot.
func benchResume(ctx context.Context, b *testing.B, c *client.Client) {
	steps, _ := sweRollout()
	traj := fmt.Sprintf("bench/swe-%d", time.Now().UnixNano())
	phases := []api.Phase{{Name: "edit"}, {Name: "test"}, {Name: "submit"}}
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "debian-12", Phases: phases, Trajectory: traj, TimeoutS: 1800})
	if err != nil {
		b.Fatal(err)
	}
	for i, st := range steps {
		if i == 18 {
			if _, err := c.Snapshot(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
		}
		if err := st.do(ctx, c, sb.ID); err != nil {
			b.Fatalf("step %d (%s): %v", i+2, st.name, err)
		}
	}
	work := time.Since(start)
	original := work + time.Duration(len(steps)+1)*modelPause
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		b.Fatal(err)
	}
	page, err := c.TrajectorySteps(ctx, traj, 0, 1000)
	if err != nil {
		b.Fatal(err)
	}
	pure := 0
	for _, st := range page.Steps {
		if st.Pure {
			pure++
		}
	}
	for _, fromScratch := range []bool{true, false} {
		waitEnded(b, c, traj)
		t0 := time.Now()
		res, err := c.Resume(ctx, traj, api.ResumeRequest{FromScratch: fromScratch})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		name := "scratch"
		if !fromScratch {
			name = "snapshot"
		}
		if fromScratch && res.Skipped != pure {
			b.Errorf("resume from scratch skipped %d steps; the log has %d pure", res.Skipped, pure)
		}
		b.ReportMetric(ms(d), "resume-"+name+"-ms")
		b.ReportMetric(original.Seconds()/d.Seconds(), "speedup-"+name+"-x")
		b.Logf("resume from %s: %.0f ms, %d replayed, %d skipped (the log has %d pure); the original took %.1f s of work + %d × 2 s of model = %.1f s: %.0f×",
			name, ms(d), res.Replayed, res.Skipped, pure, work.Seconds(), len(steps)+1, original.Seconds(), original.Seconds()/d.Seconds())
		if err := c.DeleteSandbox(ctx, res.Sandbox.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// waitEnded waits until traj's head says its sandbox is gone.
func waitEnded(b *testing.B, c *client.Client, traj string) {
	testenv.Eventually(b, 30*time.Second, "trajectory "+traj+" to end", func() bool {
		h, err := c.Trajectory(context.Background(), traj)
		return err == nil && h.State != api.TrajectoryRecording && h.State != api.TrajectoryResuming
	})
}

// forkPause is the pause before each fork of benchFork.
const forkPause = 2 * time.Second

// benchFork forks a sandbox with a 10 MB writable layer into 16, a few
// times, forkPause apart.
func benchFork(ctx context.Context, b *testing.B, c *client.Client) {
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "debian-12", DiskMB: 512})
	if err != nil {
		b.Fatal(err)
	}
	if res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Command: "head -c 10485760 /dev/urandom > /workspace/state.bin"}); err != nil || res.ExitCode != 0 {
		b.Fatalf("writing 10 MB: %+v, %v", res, err)
	}
	var all []time.Duration
	runs, count := 5, 16
	if testing.Short() {
		runs, count = 1, 2
	}
	for range runs {
		// The pause a trainer's model inference makes between forks: the
		// node refills its idle agents (one at a time) meanwhile.
		time.Sleep(forkPause)
		t0 := time.Now()
		fr, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: count})
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, time.Since(t0))
		for _, ch := range fr.Sandboxes {
			if err := c.DeleteSandbox(ctx, ch.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(ms(pct(all, 0.5)), "fork16-p50-ms")
	b.ReportMetric(ms(pct(all, 0.99)), "fork16-p99-ms")
	b.Logf("fork(16) of a 10 MB writable layer, all 16 ready: p50 %.0f ms, p99 %.0f ms (%d runs)", ms(pct(all, 0.5)), ms(pct(all, 0.99)), len(all))
	_ = c.DeleteSandbox(ctx, sb.ID)
}

// benchSnapshot snapshots a 100 MB writable layer, then again after a
// 1 MB change.
func benchSnapshot(ctx context.Context, b *testing.B, c *client.Client) {
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "debian-12", DiskMB: 1024})
	if err != nil {
		b.Fatal(err)
	}
	run := func(cmd string) {
		if res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Command: cmd, TimeoutS: 120}); err != nil || res.ExitCode != 0 {
			b.Fatalf("%s: %+v, %v", cmd, res, err)
		}
	}
	files := 100
	if testing.Short() {
		files = 4
	}
	run(fmt.Sprintf("for i in $(seq %d); do head -c 1048576 /dev/urandom > /workspace/f$i; done", files))
	t0 := time.Now()
	s1, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		b.Fatal(err)
	}
	d1 := time.Since(t0)
	run("head -c 1048576 /dev/urandom > /workspace/g")
	t0 = time.Now()
	s2, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		b.Fatal(err)
	}
	d2 := time.Since(t0)
	b.ReportMetric(ms(d1), "snapshot100MB-ms")
	b.ReportMetric(float64(s1.Bytes)/(1<<20), "snapshot100MB-stored-MiB")
	b.ReportMetric(ms(d2), "snapshot+1MB-ms")
	b.ReportMetric(float64(s2.Bytes)/(1<<20), "snapshot+1MB-stored-MiB")
	b.Logf("snapshot of 100 MB: %.0f ms, %.1f MiB stored; after a 1 MB change: %.0f ms, %.2f MiB stored",
		ms(d1), float64(s1.Bytes)/(1<<20), ms(d2), float64(s2.Bytes)/(1<<20))
	_ = c.DeleteSandbox(ctx, sb.ID)
}
