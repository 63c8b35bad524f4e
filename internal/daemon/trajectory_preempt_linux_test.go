package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// rolloutStep is one action of the software-engineering rollout below.
type rolloutStep struct {
	name string
	do   func(ctx context.Context, c *client.Client, id string) error
}

func writeStep(path, content string) rolloutStep {
	return rolloutStep{"write " + path, func(ctx context.Context, c *client.Client, id string) error {
		_, err := c.WriteFile(ctx, id, path, strings.NewReader(content), client.WriteOptions{Parents: true})
		return err
	}}
}

func shStep(cmd string) rolloutStep {
	return rolloutStep{cmd, func(ctx context.Context, c *client.Client, id string) error {
		res, err := c.Exec(ctx, id, api.ExecRequest{Command: cmd, Cwd: "/workspace/proj", TimeoutS: 120})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("%q exited %d: %s%s", cmd, res.ExitCode, res.Stdout, res.Stderr)
		}
		return nil
	}}
}

func phaseStep(p string) rolloutStep {
	return rolloutStep{"phase " + p, func(ctx context.Context, c *client.Client, id string) error {
		_, err := c.SetPhase(ctx, id, p, false)
		return err
	}}
}

// sweRollout is the rollout after the create (40 steps with it), and
// the index of the step that the node's death interrupts:
// a small shell project is written, built and tested, edited, a server
// started in the background, and moved through two phase changes. Many
// of its steps read only (tests, listings): pure.
func sweRollout() ([]rolloutStep, int) {
	s := []rolloutStep{
		{"mkdir", func(ctx context.Context, c *client.Client, id string) error {
			_, err := c.Mkdir(ctx, id, "/workspace/proj/src", true)
			return err
		}},
		writeStep("/workspace/proj/src/greet.sh", "greet() { echo \"Hello, $1\"; }\n"),
		writeStep("/workspace/proj/src/math.sh", "add() { echo $(($1 + $2)); }\n"),
		writeStep("/workspace/proj/build.sh", "mkdir -p build && cat src/*.sh > build/lib.sh && echo 'greet \"$@\"' > build/main.sh\n"),
		writeStep("/workspace/proj/test.sh", ". build/lib.sh\n[ \"$(add 2 3)\" = 5 ] || exit 1\ngreet world | grep -q world || exit 1\necho ok\n"),
		shStep("sh build.sh"),
		shStep("sh test.sh"),
		shStep("ls -la build"),
		shStep("sed -i 's/Hello/Hi/' src/greet.sh"),
		shStep("sh build.sh"),
		shStep("sh test.sh"),
		shStep("cat build/lib.sh"),
		phaseStep("test"),
		shStep("sh test.sh"),
		shStep("wc -l src/*.sh"),
	}
	for i := 1; len(s) < 24; i++ {
		s = append(s, writeStep(fmt.Sprintf("/workspace/proj/src/mod%d.sh", i), fmt.Sprintf("mod%d() { echo %d; }\n", i, i*i)),
			shStep("sh build.sh"), shStep("sh test.sh"))
	}
	// Both phase changes come before the node dies, so the resume
	// replays them; the server starts after the last (a phase change
	// ends the processes of the phase before).
	s = append(s, phaseStep("submit"), rolloutStep{"server", func(ctx context.Context, c *client.Client, id string) error {
		_, err := c.StartProcess(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "3600"}})
		return err
	}})
	// The step that the node's death interrupts.
	interrupted := len(s)
	s = append(s, shStep("sleep 4; echo late > late.txt"))
	s = append(s,
		shStep("grep -c mod build/lib.sh"),
		shStep("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf /workspace/proj.tar -C /workspace proj"),
		shStep("sha256sum /workspace/proj.tar > /workspace/proj.sum"),
		shStep("rm -r build"),
		shStep("sh build.sh"),
		shStep("sh test.sh"),
		writeStep("/workspace/proj/NOTES", "done\n"),
		shStep("ls -R"),
		shStep("mv NOTES NOTES.txt"),
		shStep("sh test.sh"),
		shStep("find . -type f | sort"),
		shStep("echo finished >> NOTES.txt"),
	)
	return s, interrupted
}

// treeDigest digests every file under /workspace (path and content).
func treeDigest(ctx context.Context, t *testing.T, c *client.Client, id string) string {
	t.Helper()
	res, err := c.Exec(ctx, id, api.ExecRequest{Command: "cd /workspace && find . -type f | LC_ALL=C sort | xargs sha256sum"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("digesting %s: %+v, %v", id, res, err)
	}
	return res.Stdout
}

// retrying repeats a call while the answer is a retryable 503 (the
// sandbox being resumed), for up to two minutes.
func retrying(t *testing.T, what string, call func() error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := call()
		if err == nil {
			return
		}
		if !errors.Is(err, client.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestTrajectoryResumeAfterNodeLoss runs a 40-step rollout on debian-12
// in three sandboxes: two on a second node, recorded with
// resume_on_preempt (one takes a snapshot at step 20), and an
// uninterrupted control on the first. The second node is killed with
// SIGKILL while a step runs; both recorded sandboxes are resumed on the
// first node behind their IDs, the interrupted step fails with a
// retryable error and runs again on the new incarnation, the rollout
// goes on to the end, and all three end with byte-identical files.
func TestTrajectoryResumeAfterNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("builds debian-12 and runs two nodes")
	}
	dir := containerDataDir(t)
	u := startUp(t, dir, func(c *config.Config) {
		withContainers(t)(c)
		c.NATS.Listen = "127.0.0.1:0"
		c.Images.SkipSlow = false // debian-12
		c.Limits.NodeLost = config.Duration{Duration: 6 * time.Second}
	})
	ctx := context.Background()
	c := u.c
	waitImage(t, c, "debian-12", 10*time.Minute)

	// The second node, a child process that can be killed.
	natsToken, _, err := auth.LoadOrCreateAt(filepath.Join(u.dir, "nats.token"))
	if err != nil {
		t.Fatal(err)
	}
	bdir := shortTempDir(t)
	h := newContainerHost(5)
	t.Cleanup(func() { noContainerLeftovers(t, bdir, h) })
	bcfg := containerConfig(t, bdir, h)
	bcfg.Node.ID = "node-b"
	bcfg.NATS.URL, bcfg.NATS.Token, bcfg.NATS.Listen = u.info.NATSURL, natsToken, "none"
	b := launchNode(t, c, bcfg)

	phases := []api.Phase{{Name: "edit"}, {Name: "test"}, {Name: "submit"}}
	var x, y, z *api.Sandbox
	for attempt := 0; (x == nil || y == nil || z == nil) && attempt < 40; attempt++ {
		req := api.CreateSandboxRequest{Tier: api.TierContainer, Image: "debian-12", Phases: phases, TimeoutS: 1800}
		if x == nil || y == nil {
			req.Trajectory, req.ResumeOnPreempt = fmt.Sprintf("swe/rollout-%d", attempt), true
		}
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case req.Trajectory != "" && sb.Node == "node-b" && x == nil:
			x = sb
		case req.Trajectory != "" && sb.Node == "node-b":
			y = sb
		case req.Trajectory == "" && sb.Node == "test-node":
			z = sb
		default:
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if x == nil || y == nil || z == nil {
		t.Fatalf("placement: x %v, y %v, z %v", x, y, z)
	}
	steps, interrupted := sweRollout()
	if n := len(steps) + 1; n != 40 {
		t.Fatalf("the rollout has %d steps", n)
	}
	run := func(id string, from, to int) {
		for i := from; i < to; i++ {
			if err := steps[i].do(ctx, c, id); err != nil {
				t.Fatalf("%s, step %d (%s): %v", id, i+2, steps[i].name, err)
			}
		}
	}
	for _, sb := range []*api.Sandbox{x, y, z} {
		run(sb.ID, 0, 18)
	}
	snap, err := c.Snapshot(ctx, y.ID) // step 20 of y's trajectory
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []*api.Sandbox{x, y, z} {
		run(sb.ID, 18, interrupted)
	}
	run(z.ID, interrupted, len(steps))

	// The node dies while the interrupted step runs in x and y.
	errs := make(chan error, 2)
	for _, sb := range []*api.Sandbox{x, y} {
		go func() { errs <- steps[interrupted].do(ctx, c, sb.ID) }()
	}
	time.Sleep(time.Second)
	b.kill()
	// The killed node comes back at the end, whatever happened: what it
	// left running is no one's by then (the records moved or ended), so
	// it destroys it; then it stops for good.
	t.Cleanup(func() {
		b := launchNode(t, c, bcfg)
		testenv.Eventually(t, time.Minute, "node-b to remove its orphans", func() bool {
			return len(testenv.SandboxProcs(h.IDBase, h.IDCount, h.CgroupParent)) == 0
		})
		b.stop()
	})
	for range 2 {
		err := testenv.Recv(t, errs, 2*time.Minute, "the interrupted step's answer")
		if codeOf(err) != api.CodeTrajectoryInFlight {
			t.Errorf("the interrupted step: %v (code %q), want %s", err, codeOf(err), api.CodeTrajectoryInFlight)
		}
	}
	for _, sb := range []*api.Sandbox{x, y} {
		retrying(t, "the interrupted step again", func() error { return steps[interrupted].do(ctx, c, sb.ID) })
		run(sb.ID, interrupted+1, len(steps))
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.Incarnation != 2 || got.Node != "test-node" || got.State != api.StateRunning {
			t.Errorf("resumed sandbox: %+v, %v", got, err)
		}
		ps, err := c.ListProcesses(ctx, sb.ID)
		if err != nil || !slices.ContainsFunc(ps.Processes, func(p api.Process) bool { return slices.Equal(p.Cmd, []string{"sleep", "3600"}) }) {
			t.Errorf("the background server after the resume: %+v, %v", ps, err)
		}
	}
	want := treeDigest(ctx, t, c, z.ID)
	for _, sb := range []*api.Sandbox{x, y} {
		if got := treeDigest(ctx, t, c, sb.ID); got != want {
			t.Errorf("%s's files differ from the uninterrupted run:\n%s\nwant\n%s", sb.ID, got, want)
		}
	}
	// What the resumes did, from the logs.
	for _, tc := range []struct {
		sb   *api.Sandbox
		from string
	}{{x, ""}, {y, snap.ID}} {
		page, err := c.TrajectorySteps(ctx, tc.sb.Trajectory, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var resume *api.StepResume
		pureBefore, impureBefore := 0, 0
		for _, st := range page.Steps {
			if st.Kind == api.KindResume {
				resume = st.Resume
				break
			}
			if st.Kind == api.KindExec && st.Pure {
				pureBefore++
			} else if st.Kind != api.KindCreate && st.Kind != api.KindSnapshot {
				impureBefore++
			}
		}
		if resume == nil || resume.Reason != "preempted" || resume.From != tc.from || resume.Divergence != nil {
			t.Fatalf("%s: resume step %+v", tc.sb.ID, resume)
		}
		if pureBefore == 0 || tc.from == "" && (resume.Replayed != impureBefore || resume.Skipped != pureBefore) {
			t.Errorf("%s: replayed %d, skipped %d; the log had %d impure and %d pure steps before", tc.sb.ID, resume.Replayed, resume.Skipped, impureBefore, pureBefore)
		}
		if tc.from != "" && resume.Replayed >= impureBefore {
			t.Errorf("%s: from the snapshot, %d steps replayed of %d", tc.sb.ID, resume.Replayed, impureBefore)
		}
		if len(page.Steps) < 40 {
			t.Errorf("%s: %d steps logged", tc.sb.ID, len(page.Steps))
		}
	}
	for _, sb := range []*api.Sandbox{x, y, z} {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Error(err)
		}
	}
}

// launchNode starts a node role in a child process and waits until the
// API server lists it.
func launchNode(t *testing.T, c *client.Client, cfg config.Config) *procDaemon {
	t.Helper()
	d := launchProcDaemon(t, cfg, "DSEC_TEST_ROLE=node")
	testenv.Eventually(t, 2*time.Minute, "node "+cfg.Node.ID+" to join", func() bool {
		nodes, err := c.Nodes(context.Background())
		return err == nil && slices.ContainsFunc(nodes.Nodes, func(n api.Node) bool {
			return n.ID == cfg.Node.ID && n.Ready && time.Since(n.LastSeen) < 5*time.Second
		})
	})
	return d
}

// waitImage waits until the server lists image name.
func waitImage(t testing.TB, c *client.Client, name string, d time.Duration) {
	t.Helper()
	testenv.Eventually(t, d, "image "+name, func() bool {
		imgs, err := c.Images(context.Background())
		return err == nil && slices.ContainsFunc(imgs.Images, func(i api.Image) bool { return strings.HasPrefix(i.Name, name+":") })
	})
}
