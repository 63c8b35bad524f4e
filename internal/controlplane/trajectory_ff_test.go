package controlplane

import (
	"testing"

	"github.com/dsec-dev/dsec/api"
)

func execStep(n int, cmd ...string) api.TrajectoryStep {
	return api.TrajectoryStep{Step: n, Kind: api.KindExec, Exec: &api.StepExec{Request: api.ExecRequest{Cmd: cmd}, ExitCode: n}}
}

// TestFastForward: a resumed sandbox answers, from its log, the requests
// that repeat it in order, skipping what no request makes (the create,
// snapshots, resumes); the first request that differs is not answered.
func TestFastForward(t *testing.T) {
	log := []api.TrajectoryStep{
		{Step: 1, Kind: api.KindCreate, Create: &api.StepCreate{}},
		execStep(2, "make"),
		{Step: 3, Kind: api.KindWrite, File: &api.StepFile{Path: "a.go", Digest: "sha256:aa", Size: 2}},
		{Step: 4, Kind: api.KindSnapshot, Snapshot: &api.Snapshot{ID: "snap-1"}},
		{Step: 5, Kind: api.KindPhase, Phase: &api.SetPhaseRequest{Phase: "test"}},
		execStep(6, "make", "test"),
	}
	f := &fastForward{steps: log}
	st, ok := f.matchExec(api.ExecRequest{Cmd: []string{"make"}, TimeoutS: 30}, "")
	if !ok || st.Step != 2 {
		t.Fatalf("first exec: step %d, %v", st.Step, ok)
	}
	if !f.match(&api.TrajectoryStep{Kind: api.KindWrite, File: &api.StepFile{Path: "a.go", Digest: "sha256:aa", Size: 2}}) {
		t.Fatal("the same write did not match")
	}
	if !f.match(&api.TrajectoryStep{Kind: api.KindPhase, Phase: &api.SetPhaseRequest{Phase: "test"}}) {
		t.Fatal("the phase change after the snapshot did not match")
	}
	// Negative controls: the same kind with other arguments.
	g := *f
	if _, ok := g.matchExec(api.ExecRequest{Cmd: []string{"make", "test"}, Env: map[string]string{"X": "1"}}, ""); ok {
		t.Error("an exec with other env matched")
	}
	if _, ok := g.matchExec(api.ExecRequest{Cmd: []string{"make", "test"}}, "sha256:stdin"); ok {
		t.Error("an exec with other stdin matched")
	}
	if st, ok := f.matchExec(api.ExecRequest{Cmd: []string{"make", "test"}}, ""); !ok || st.Step != 6 {
		t.Fatalf("last exec: step %d, %v", st.Step, ok)
	}
	if _, ok := f.matchExec(api.ExecRequest{Cmd: []string{"make", "test"}}, ""); ok {
		t.Error("a request past the end of the log matched")
	}

	h := &fastForward{steps: log}
	if h.match(&api.TrajectoryStep{Kind: api.KindWrite, File: &api.StepFile{Path: "a.go", Digest: "sha256:aa", Size: 2}}) {
		t.Error("a write matched where the log has an exec")
	}
	if h.match(&api.TrajectoryStep{Kind: api.KindWrite, File: &api.StepFile{Path: "a.go", Digest: "sha256:bb", Size: 2}}) {
		t.Error("a write of other content matched")
	}
}

// TestRedactExec: the values of secret env keys and stdin never reach
// the log; the keys stay, so a replay knows to fill them in.
func TestRedactExec(t *testing.T) {
	req := api.ExecRequest{Cmd: []string{"deploy"}, Env: map[string]string{"TOKEN": "s3cret", "MODE": "fast"}, Stdin: "password"}
	got, digest := redactExec(req, []string{"TOKEN", "ABSENT"})
	if got.Env["TOKEN"] != "" || got.Env["MODE"] != "fast" || len(got.Env) != 2 {
		t.Errorf("env as logged: %v", got.Env)
	}
	if req.Env["TOKEN"] != "s3cret" {
		t.Error("the caller's env was changed")
	}
	if got.Stdin != "" || digest == "" || digest == "password" {
		t.Errorf("stdin as logged: %q, digest %q", got.Stdin, digest)
	}
	// Negative control: without secrets the env is logged as given.
	if got, _ := redactExec(req, nil); got.Env["TOKEN"] != "s3cret" {
		t.Errorf("env without secrets: %v", got.Env)
	}
}

func TestCapBuffer(t *testing.T) {
	b := capBuffer{max: 5}
	b.add([]byte("abc"))
	b.add([]byte("defg"))
	b.add([]byte("h"))
	if b.String() != "abcde" {
		t.Errorf("capped buffer holds %q", b.String())
	}
}
