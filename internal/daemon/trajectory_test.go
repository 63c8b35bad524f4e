package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// codeOf is an API error's code ("" for other errors).
func codeOf(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

// wantCode checks that err is an API error with code.
func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if err == nil || codeOf(err) != code {
		t.Errorf("%s: %v (code %q), want code %s", what, err, codeOf(err), code)
	}
}

func readString(t *testing.T, c *client.Client, id, path string) string {
	t.Helper()
	b, err := c.ReadFileBytes(context.Background(), id, path)
	if err != nil {
		t.Fatalf("reading %s in %s: %v", path, id, err)
	}
	return string(b)
}

// TestTrajectoryFunctionTier records a function sandbox's rollout, reads
// it back (steps, export), resumes it after the sandbox is gone, and
// fast-forwards a harness that starts its loop again.
func TestTrajectoryFunctionTier(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	c := u.c
	const traj = "run-1/task-2/rollout-3"
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Trajectory: traj,
		Env: map[string]string{"API_KEY": "k-123", "MODE": "m"}, SecretEnv: []string{"API_KEY"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Trajectory != traj || sb.Incarnation != 1 {
		t.Fatalf("created %+v", sb)
	}
	// The rollout: 2 pure steps among 6 that change state.
	cur := sb.ID // the sandbox the steps go to
	steps := []func() error{
		func() error {
			_, err := c.WriteFile(ctx, cur, "a.txt", strings.NewReader("alpha\n"), client.WriteOptions{})
			return err
		},
		func() error {
			return execOK(ctx, c, cur, api.ExecRequest{Cmd: []string{"write", "b.txt"}, Stdin: "bravo\n"})
		},
		func() error { return execOK(ctx, c, cur, api.ExecRequest{Cmd: []string{"cat", "a.txt"}}) }, // pure
		func() error {
			_, err := c.Mkdir(ctx, cur, "dir", false)
			return err
		},
		func() error { _, err := c.Rename(ctx, cur, "b.txt", "dir/b.txt"); return err },
		func() error { return execOK(ctx, c, cur, api.ExecRequest{Cmd: []string{"ls", "dir"}}) }, // pure
		func() error {
			return execOK(ctx, c, cur, api.ExecRequest{Cmd: []string{"write", "-a", "c.txt"}, Stdin: "x"})
		},
		func() error { return c.RemoveFile(ctx, cur, "a.txt", false) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i+2, err)
		}
	}
	page, err := c.TrajectorySteps(ctx, traj, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	kinds := []string{}
	pure := 0
	for _, st := range page.Steps {
		kinds = append(kinds, st.Kind)
		if st.Pure {
			pure++
		}
		if st.Exec != nil && st.Exec.Request.Env["API_KEY"] != "" {
			t.Errorf("step %d logs the secret", st.Step)
		}
	}
	want := "create write exec exec mkdir rename exec exec remove"
	if strings.Join(kinds, " ") != want || pure != 2 {
		t.Fatalf("logged kinds %q (%d pure), want %q (2 pure)", kinds, pure, want)
	}
	if c0 := page.Steps[0].Create; c0 == nil || c0.Request.Env["API_KEY"] != "" || c0.Request.Env["MODE"] != "m" || len(c0.SecretEnv) != 1 {
		t.Errorf("create step: %+v", c0)
	}
	if page.Trajectory.State != api.TrajectoryRecording || page.Trajectory.Sandbox != sb.ID {
		t.Errorf("head while recording: %+v", page.Trajectory)
	}

	// Resuming a trajectory whose sandbox runs is refused.
	_, err = c.Resume(ctx, traj, api.ResumeRequest{SecretEnv: map[string]string{"API_KEY": "k-123"}})
	wantCode(t, "resume while running", err, api.CodeTrajectoryRunning)
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Once the delete has answered, the log ends with the end step and
	// the head says ended (no waiting: a trainer exports right away).
	if head, err := c.Trajectory(ctx, traj); err != nil || head.State != api.TrajectoryEnded {
		t.Errorf("head right after the delete: %+v, %v", head, err)
	}
	if page, err := c.TrajectorySteps(ctx, traj, 0, 1000); err != nil || len(page.Steps) == 0 || page.Steps[len(page.Steps)-1].Kind != api.KindEnd {
		t.Errorf("steps right after the delete: %+v, %v", page, err)
	}
	_, err = c.Resume(ctx, traj, api.ResumeRequest{})
	wantCode(t, "resume without the secret", err, api.CodeSecretEnvMissing)
	_, err = c.Resume(ctx, traj, api.ResumeRequest{SecretEnv: map[string]string{"API_KEY": "k-123"}, OnDivergence: "maybe"})
	wantCode(t, "resume with a bad on_divergence", err, api.CodeInvalidOnDivergence)
	_, err = c.Resume(ctx, "no/such/trajectory", api.ResumeRequest{})
	wantCode(t, "resume of an unknown trajectory", err, api.CodeTrajectoryNotFound)

	res, err := c.Resume(ctx, traj, api.ResumeRequest{SecretEnv: map[string]string{"API_KEY": "k-123"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 6 || res.Skipped != 2 || res.Divergence != nil || res.Sandbox.Incarnation != 2 {
		t.Fatalf("resume: %+v", res)
	}
	nb := res.Sandbox.ID
	for path, want := range map[string]string{"dir/b.txt": "bravo\n", "c.txt": "x"} {
		if got := readString(t, c, nb, path); got != want {
			t.Errorf("%s after resume: %q, want %q", path, got, want)
		}
	}
	if _, err := c.StatFile(ctx, nb, "a.txt"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("a.txt, removed in the rollout, after resume: %v", err)
	}
	env, err := c.Exec(ctx, nb, api.ExecRequest{Cmd: []string{"env"}})
	if err != nil || !strings.Contains(env.Stdout, "API_KEY=k-123") {
		t.Errorf("the secret is not back in the resumed env: %+v, %v", env, err)
	}

	// The harness starts its loop again: the first steps are answered
	// from the log (the appending write does not run twice) until one
	// differs. That env exec just ended the fast-forward, so resume
	// again for a clean one.
	if err := c.DeleteSandbox(ctx, nb); err != nil {
		t.Fatal(err)
	}
	res, err = c.Resume(ctx, traj, api.ResumeRequest{SecretEnv: map[string]string{"API_KEY": "k-123"}})
	if err != nil {
		t.Fatal(err)
	}
	nb = res.Sandbox.ID
	cur = nb
	for i, step := range steps[:6] {
		if err := step(); err != nil {
			t.Fatalf("fast-forward step %d: %v", i+2, err)
		}
	}
	// Answered from the log, none of them ran: b.txt was not written
	// again where the rename had taken it from.
	if _, err := c.StatFile(ctx, nb, "b.txt"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("b.txt after the fast-forward: %v (the logged write ran again)", err)
	}
	if err := execOK(ctx, c, nb, api.ExecRequest{Cmd: []string{"write", "-a", "c.txt"}, Stdin: "x"}); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, c, nb, "c.txt"); got != "x" {
		t.Errorf("c.txt after a fast-forwarded append: %q, want \"x\" (the append was run again)", got)
	}
	// A different request ends it: this append runs.
	if err := execOK(ctx, c, nb, api.ExecRequest{Cmd: []string{"write", "-a", "c.txt"}, Stdin: "y"}); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, c, nb, "c.txt"); got != "xy" {
		t.Errorf("c.txt after a live append: %q, want \"xy\"", got)
	}

	// The export is the whole record, one JSON step per line, in order.
	var buf bytes.Buffer
	if err := c.ExportTrajectory(ctx, traj, &buf); err != nil {
		t.Fatal(err)
	}
	n := 0
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var st api.TrajectoryStep
		if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
			t.Fatalf("export line %d: %v", n+1, err)
		}
		n++
		if st.Step != n || st.Trajectory != traj {
			t.Fatalf("export line %d is step %d of %q", n, st.Step, st.Trajectory)
		}
	}
	if err := c.DeleteSandbox(ctx, nb); err != nil {
		t.Fatal(err)
	}
	// The end is logged, and the head says so, shortly after the delete.
	var head api.Trajectory
	testenv.Eventually(t, 30*time.Second, "the trajectory to end", func() bool {
		head, err = c.Trajectory(ctx, traj)
		return err == nil && head.State == api.TrajectoryEnded
	})
	if head.Incarnations != 3 || head.Steps != n+1 {
		t.Errorf("head %+v after %d exported steps and the end", head, n)
	}
}

// execOK runs a command that must succeed.
func execOK(ctx context.Context, c *client.Client, id string, req api.ExecRequest) error {
	res, err := c.Exec(ctx, id, req)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%v exited %d: %s", req.Cmd, res.ExitCode, res.Stderr)
	}
	return nil
}

// TestForkAndSnapshotFunctionTier: fork(3) children start from the
// parent's files and do not see each other's writes; a snapshot starts
// a sandbox of its own; bad input changes nothing.
func TestForkAndSnapshotFunctionTier(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	c := u.c
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Trajectory: "fork-parent"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "shared.txt", strings.NewReader("from the parent"), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Fork(ctx, sb.ID, api.ForkRequest{Count: 0})
	wantCode(t, "fork(0)", err, api.CodeInvalidForkCount)
	_, err = c.Fork(ctx, sb.ID, api.ForkRequest{Count: 1000})
	wantCode(t, "fork(1000)", err, api.CodeInvalidForkCount)
	list, err := c.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(list.Sandboxes) != 1 {
		t.Fatalf("after refused forks: %+v, %v", list, err)
	}

	fr, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Sandboxes) != 3 || fr.Snapshot.ID == "" {
		t.Fatalf("fork: %+v", fr)
	}
	for i, ch := range fr.Sandboxes {
		if got := readString(t, c, ch.ID, "shared.txt"); got != "from the parent" {
			t.Errorf("child %d sees %q", i, got)
		}
		if ch.Trajectory == "" || !strings.HasPrefix(ch.Trajectory, "fork-parent/fork-") {
			t.Errorf("child %d's trajectory: %q", i, ch.Trajectory)
		}
		if ch.Node != sb.Node {
			t.Errorf("child %d on %s, parent on %s", i, ch.Node, sb.Node)
		}
	}
	if _, err := c.WriteFile(ctx, fr.Sandboxes[0].ID, "mine.txt", strings.NewReader("child 0"), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, fr.Sandboxes[1].ID, fr.Sandboxes[2].ID} {
		if _, err := c.StatFile(ctx, id, "mine.txt"); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("child 0's write seen in %s: %v", id, err)
		}
	}
	head, err := c.Trajectory(ctx, fr.Sandboxes[0].Trajectory)
	if err != nil || head.Parent != "fork-parent" || head.ParentStep != fr.Snapshot.Step {
		t.Errorf("child trajectory head %+v, %v", head, err)
	}

	// A snapshot starts sandboxes of its own.
	snap, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	from, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, FromSnapshot: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := readString(t, c, from.ID, "shared.txt"); got != "from the parent" {
		t.Errorf("sandbox from the snapshot sees %q", got)
	}
	_, err = c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, FromSnapshot: "snap-nosuch"})
	wantCode(t, "create from an unknown snapshot", err, api.CodeSnapshotNotFound)
	before, err := c.Trajectory(ctx, "fork-parent")
	if err != nil {
		t.Fatal(err)
	}
	listed := func() int {
		l, err := c.ListSandboxes(ctx, client.ListOptions{Tier: api.TierFunction, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Sandboxes)
	}
	n := listed()
	_, err = c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Trajectory: "fork-parent"})
	wantCode(t, "a trajectory name in use", err, api.CodeTrajectoryExists)
	// The sandbox made meanwhile (the head is written while it is) is
	// gone, and the trajectory that holds the name is as it was.
	if after, err := c.Trajectory(ctx, "fork-parent"); err != nil || after.Sandbox != before.Sandbox || after.Steps != before.Steps || after.State != before.State {
		t.Errorf("the trajectory holding the name: %+v → %+v, %v", before, after, err)
	}
	if got := listed(); got != n {
		t.Errorf("a create refused for its trajectory's name left a sandbox: %d listed, %d before", got, n)
	}
	_, err = c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Trajectory: "../etc"})
	wantCode(t, "a bad trajectory name", err, api.CodeInvalidTrajectoryID)
	if err := c.DeleteSandbox(ctx, from.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.Snapshot(ctx, from.ID)
	wantCode(t, "snapshot of a deleted sandbox", err, api.CodeSandboxNotRunning)
	for _, ch := range append(fr.Sandboxes, *sb) {
		if err := c.DeleteSandbox(ctx, ch.ID); err != nil {
			t.Error(err)
		}
	}
	_, err = c.Trajectory(ctx, "no/such")
	wantCode(t, "an unknown trajectory", err, api.CodeTrajectoryNotFound)
	if err := c.DeleteTrajectory(ctx, "fork-parent"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Trajectory(ctx, "fork-parent")
	wantCode(t, "a deleted trajectory", err, api.CodeTrajectoryNotFound)
}
