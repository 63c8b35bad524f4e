package cli

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

const trajID = "run-42/task-7/rollout-3"

func TestSandboxCreateTrajectory(t *testing.T) {
	var got api.CreateSandboxRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		decode(t, r, &got)
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1", Trajectory: trajID, Incarnation: 1})
	})
	inv := invocation{env: testEnv(t, map[string]string{"TOKEN_FROM_ENV": "s3cret"})}
	res := inv.run(t, mux, "sandbox", "create", "--tier", "container", "--trajectory", trajID, "--record",
		"--env", "A=1", "--env", "B=2", "--secret-env", "KEY=v=w", "--secret-env", "TOKEN_FROM_ENV", "--secret-env", "B",
		"--resume-on-preempt")
	if res.code != 0 || res.stdout != "sb-1\n" {
		t.Fatalf("got %+v, want the ID and exit 0", res)
	}
	want := api.CreateSandboxRequest{Tier: "container", Trajectory: trajID, Record: true, ResumeOnPreempt: true,
		Env:       map[string]string{"A": "1", "B": "2", "KEY": "v=w", "TOKEN_FROM_ENV": "s3cret"},
		SecretEnv: []string{"KEY", "TOKEN_FROM_ENV", "B"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}

	got = api.CreateSandboxRequest{}
	if res := dsec(t, mux, "sandbox", "create", "--from-snapshot", "snap-1"); res.code != 0 {
		t.Fatalf("--from-snapshot: %+v", res)
	}
	if diff := cmp.Diff(api.CreateSandboxRequest{FromSnapshot: "snap-1"}, got); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}

	got = api.CreateSandboxRequest{}
	if res := dsec(t, mux, "sandbox", "create", "--request-id", "job-1/try"); res.code != 0 {
		t.Fatalf("--request-id: %+v", res)
	}
	if diff := cmp.Diff(api.CreateSandboxRequest{RequestID: "job-1/try"}, got); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}
}

func TestTrajectoryUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"secret without value", []string{"sandbox", "create", "--secret-env", "NOPE"}, "--secret-env NOPE: no value"},
		{"secret with empty key", []string{"sandbox", "create", "--secret-env", "=v"}, `--secret-env "=v": want KEY=VALUE or KEY`},
		{"snapshot and image", []string{"sandbox", "create", "--from-snapshot", "s", "--image", "x"}, "give --from-snapshot or --image/--layer, not both"},
		{"resume secret without value", []string{"traj", "resume", trajID, "--secret-env", "NOPE"}, "--secret-env NOPE: no value"},
		{"resume bad divergence", []string{"traj", "resume", trajID, "--on-divergence", "ignore"}, `--on-divergence "ignore": want stop or continue`},
		{"steps negative", []string{"traj", "steps", trajID, "--after", "-1"}, "--after and --limit must not be negative"},
		{"fork label", []string{"sandbox", "fork", "sb-1", "--label", "x"}, `--label "x": want KEY=VALUE`},
		{"steps without ID", []string{"traj", "steps"}, "accepts 1 arg(s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := dsec(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				t.Errorf("unexpected request %s %s", r.Method, r.URL)
			}), tt.argv...)
			if res.code != exitUsage || !strings.Contains(res.stderr, "dsec: "+tt.want) {
				t.Errorf("got exit %d, stderr %q; want exit 2 and %q", res.code, res.stderr, tt.want)
			}
		})
	}
}

// trajServer serves the trajectory trajID, whose steps come in pages of
// two, and records the IDs the routes saw.
func trajServer(t *testing.T, steps []api.TrajectoryStep, seen *[]string) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/trajectories/{id}/steps", func(w http.ResponseWriter, r *http.Request) {
		*seen = append(*seen, r.PathValue("id"))
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		page := api.TrajectorySteps{Trajectory: api.Trajectory{ID: trajID}}
		for _, s := range steps {
			if s.Step > after && len(page.Steps) < 2 {
				page.Steps = append(page.Steps, s)
			}
		}
		if n := len(page.Steps); n > 0 && page.Steps[n-1].Step < steps[len(steps)-1].Step {
			page.NextPageToken = strconv.Itoa(page.Steps[n-1].Step)
		}
		writeJSON(w, http.StatusOK, page)
	})
	mux.HandleFunc("GET /v1/trajectories/{id}/export", func(w http.ResponseWriter, r *http.Request) {
		*seen = append(*seen, r.PathValue("id"))
		if r.PathValue("id") != trajID {
			writeError(w, http.StatusNotFound, "trajectory_not_found", "not_found", "no trajectory "+r.PathValue("id"))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, s := range steps {
			_ = enc.Encode(s)
		}
	})
	mux.HandleFunc("GET /v1/trajectories/{id}", func(w http.ResponseWriter, r *http.Request) {
		*seen = append(*seen, r.PathValue("id"))
		if r.PathValue("id") != trajID {
			writeError(w, http.StatusNotFound, "trajectory_not_found", "not_found", "no trajectory "+r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, api.Trajectory{ID: trajID, State: api.TrajectoryEnded, Sandbox: "sb-1", Tier: "container",
			Steps: len(steps), Bytes: 2048, Incarnations: 2, Parent: "run-42/task-7", ParentStep: 3,
			Snapshots:  []api.Snapshot{{ID: "snap-1", Step: 4}},
			Divergence: &api.Divergence{Step: 5, Kind: "exec", Logged: "exit 0", Replayed: "exit 1"},
			CreatedAt:  testNow, UpdatedAt: testNow, ExpiresAt: testNow.Add(7 * 24 * time.Hour)})
	})
	mux.HandleFunc("DELETE /v1/trajectories/{id}", func(w http.ResponseWriter, r *http.Request) {
		*seen = append(*seen, r.PathValue("id"))
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func stepFixtures() []api.TrajectoryStep {
	return []api.TrajectoryStep{
		{Step: 1, Kind: api.KindCreate, DurationMS: 120, Create: &api.StepCreate{Request: api.CreateSandboxRequest{Tier: "container", Image: "sha256:img"}}},
		{Step: 2, Kind: api.KindExec, DurationMS: 3.4, Pure: true, Exec: &api.StepExec{Request: api.ExecRequest{Cmd: []string{"ls", "-l"}}}},
		{Step: 3, Kind: api.KindWrite, File: &api.StepFile{Path: "/workspace/a.py", Size: 1536}},
		{Step: 4, Kind: api.KindExec, DurationMS: 2500, Exec: &api.StepExec{Request: api.ExecRequest{Command: "make  test\n && echo " + strings.Repeat("x", 80)}, ExitCode: 2}},
		{Step: 5, Kind: api.KindRename, File: &api.StepFile{Path: "a", To: "b"}},
		{Step: 6, Kind: api.KindResume, Resume: &api.StepResume{Reason: "preempted", Replayed: 3, Skipped: 1}},
	}
}

func TestTrajSteps(t *testing.T) {
	var seen []string
	mux := trajServer(t, stepFixtures(), &seen)
	res := dsec(t, mux, "traj", "steps", trajID)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	want := `STEP  KIND    PURE  DURATION  SUMMARY
1     create  -     120ms     container sha256:img
2     exec    yes   3ms       ls -l → exit 0
3     write   -     -         /workspace/a.py (1.5 KiB)
4     exec    -     2.5s      make test && echo ` + strings.Repeat("x", 41) + `…
5     rename  -     -         a → b
6     resume  -     -         preempted: replayed 3, skipped 1
`
	if diff := cmp.Diff(want, res.stdout); diff != "" {
		t.Errorf("output mismatch (-want +got):\n%s", diff)
	}
	// Three pages of two, each asked for with the ID as one segment.
	if diff := cmp.Diff([]string{trajID, trajID, trajID}, seen); diff != "" {
		t.Errorf("IDs the server saw (-want +got):\n%s", diff)
	}

	res = dsec(t, mux, "--json", "traj", "steps", trajID, "--after", "2", "--limit", "3")
	var got []api.TrajectoryStep
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil || res.code != 0 {
		t.Fatalf("--json printed %q (exit %d): %v", res.stdout, res.code, err)
	}
	if diff := cmp.Diff(stepFixtures()[2:5], got); diff != "" {
		t.Errorf("--json steps mismatch (-want +got):\n%s", diff)
	}
}

func TestTrajExport(t *testing.T) {
	var seen []string
	mux := trajServer(t, stepFixtures(), &seen)
	res := dsec(t, mux, "traj", "export", trajID)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	if len(lines) != len(stepFixtures()) {
		t.Fatalf("export printed %d lines, want %d:\n%s", len(lines), len(stepFixtures()), res.stdout)
	}
	for i, l := range lines {
		var s api.TrajectoryStep
		if err := json.Unmarshal([]byte(l), &s); err != nil || s.Step != i+1 {
			t.Errorf("line %d = %q (%v), want step %d", i+1, l, err, i+1)
		}
	}

	out := filepath.Join(t.TempDir(), "traj.jsonl")
	if res := dsec(t, mux, "traj", "export", trajID, "-o", out); res.code != 0 || res.stdout != "" {
		t.Fatalf("export -o: %+v", res)
	}
	b, err := os.ReadFile(out)
	if err != nil || string(b) != strings.Join(lines, "\n")+"\n" {
		t.Errorf("file holds %q (%v), want what stdout got", b, err)
	}

	// An unknown trajectory leaves no file behind.
	missing := filepath.Join(t.TempDir(), "missing.jsonl")
	res = dsec(t, mux, "traj", "export", "run-1/none", "-o", missing)
	if res.code != exitError || !strings.Contains(res.stderr, "(trajectory_not_found)") {
		t.Errorf("export of an unknown trajectory: %+v", res)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("export of an unknown trajectory left %s: %v", missing, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(missing)); len(ents) != 0 {
		t.Errorf("export left %d files behind", len(ents))
	}
}

func TestTrajGetAndRemove(t *testing.T) {
	var seen []string
	mux := trajServer(t, stepFixtures(), &seen)
	res := dsec(t, mux, "traj", "get", trajID)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	for _, want := range []string{"State:         ended", "Forked from:   run-42/task-7 after step 3", "Steps:         6",
		"Size:          2.0 KiB", "Incarnations:  2", "Snapshots:     snap-1 (step 4)", "Divergence:    step 5 (exec): logged exit 0, replayed exit 1"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, res.stdout)
		}
	}
	res = dsec(t, mux, "traj", "get", "run-1/none")
	if res.code != exitError || res.stderr != "dsec: no trajectory run-1/none (trajectory_not_found)\n" {
		t.Errorf("get of an unknown trajectory: %+v", res)
	}
	seen = nil
	if res := dsec(t, mux, "traj", "rm", trajID, "other/one"); res.code != 0 || res.stdout != trajID+"\nother/one\n" {
		t.Errorf("rm: %+v", res)
	}
	if diff := cmp.Diff([]string{trajID, "other/one"}, seen); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
}

func TestTrajList(t *testing.T) {
	var tokens []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/trajectories", func(w http.ResponseWriter, r *http.Request) {
		tok := r.URL.Query().Get("page_token")
		tokens = append(tokens, tok+"/"+r.URL.Query().Get("limit"))
		if tok == "" {
			writeJSON(w, http.StatusOK, api.TrajectoryList{NextPageToken: "p2", Trajectories: []api.Trajectory{
				{ID: trajID, State: "recording", Steps: 12, Sandbox: "sb-1", Tier: "container", Bytes: 4096, UpdatedAt: testNow.Add(-2 * time.Minute)}}})
			return
		}
		writeJSON(w, http.StatusOK, api.TrajectoryList{Trajectories: []api.Trajectory{{ID: "b", State: "ended", UpdatedAt: testNow.Add(-3 * time.Hour)}}})
	})
	res := dsec(t, mux, "traj", "ls", "--limit", "1")
	want := `ID                       STATE      STEPS  SANDBOX  TIER       SIZE     UPDATED
run-42/task-7/rollout-3  recording  12     sb-1     container  4.0 KiB  2m ago
`
	if res.code != 0 || res.stdout != want || !strings.Contains(res.stderr, "--all") {
		t.Errorf("ls: %+v\nwant stdout:\n%s", res, want)
	}
	tokens = nil
	res = dsec(t, mux, "traj", "list", "--all")
	if res.code != 0 || !strings.Contains(res.stdout, "\nb ") || len(tokens) != 2 {
		t.Errorf("ls --all: %+v after %v", res, tokens)
	}
}

func TestTrajResume(t *testing.T) {
	var got api.ResumeRequest
	var path string
	result := api.ResumeResult{Sandbox: api.Sandbox{ID: "sb-2", Trajectory: trajID, Incarnation: 2}, Replayed: 7, Skipped: 3, From: "snap-1",
		Divergence: &api.Divergence{Step: 9, Kind: "exec", Logged: "exit 0", Replayed: "exit 1"}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/trajectories/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		path = r.PathValue("id")
		got = api.ResumeRequest{}
		decode(t, r, &got)
		writeJSON(w, http.StatusCreated, result)
	})
	inv := invocation{env: testEnv(t, map[string]string{"API_KEY": "k"})}
	res := inv.run(t, mux, "traj", "resume", trajID, "--secret-env", "API_KEY", "--secret-env", "OTHER=o",
		"--on-divergence", "continue", "--from-scratch", "--tier", "function")
	if res.code != 0 || res.stdout != "sb-2\n" {
		t.Fatalf("got %+v, want the new ID alone on stdout", res)
	}
	if want := "replayed 7 steps, skipped 3 after snapshot snap-1\ndiverged at step 9 (exec): logged exit 0, replayed exit 1\n"; res.stderr != want {
		t.Errorf("stderr %q, want %q", res.stderr, want)
	}
	want := api.ResumeRequest{SecretEnv: map[string]string{"API_KEY": "k", "OTHER": "o"}, OnDivergence: "continue", FromScratch: true, Tier: "function"}
	if diff := cmp.Diff(want, got); diff != "" || path != trajID {
		t.Errorf("request to %q mismatch (-want +got):\n%s", path, diff)
	}

	res = dsec(t, mux, "--json", "traj", "resume", trajID)
	var printed api.ResumeResult
	if err := json.Unmarshal([]byte(res.stdout), &printed); err != nil || res.code != 0 {
		t.Fatalf("--json printed %q (exit %d): %v", res.stdout, res.code, err)
	}
	if diff := cmp.Diff(result, printed); diff != "" {
		t.Errorf("--json mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(api.ResumeRequest{}, got); diff != "" {
		t.Errorf("bare resume sent (-want +got):\n%s", diff)
	}
}

func TestSandboxSnapshotForkAndSnapshots(t *testing.T) {
	snap := api.Snapshot{ID: "snap-1", Sandbox: "sb-1", Trajectory: trajID, Step: 4, Tier: "container", Layers: []string{"sha256:a"}, Bytes: 1 << 20, CreatedAt: testNow}
	var fork api.ForkRequest
	var deleted []string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/sb-1/snapshot", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, snap)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		fork = api.ForkRequest{}
		decode(t, r, &fork)
		if fork.Count < 1 {
			writeError(w, http.StatusBadRequest, "invalid_fork_count", "invalid_argument", "count must be 1 to 64")
			return
		}
		res := api.ForkResult{Snapshot: snap}
		for i := range fork.Count {
			res.Sandboxes = append(res.Sandboxes, api.Sandbox{ID: "sb-c" + strconv.Itoa(i)})
		}
		writeJSON(w, http.StatusCreated, res)
	})
	mux.HandleFunc("GET /v1/snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != snap.ID {
			writeError(w, http.StatusNotFound, "snapshot_not_found", "not_found", "no snapshot "+r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, snap)
	})
	mux.HandleFunc("DELETE /v1/snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		deleted = append(deleted, r.PathValue("id"))
		w.WriteHeader(http.StatusNoContent)
	})

	if res := dsec(t, mux, "sandbox", "snapshot", "sb-1"); res.code != 0 || res.stdout != "snap-1\n" {
		t.Errorf("snapshot: %+v", res)
	}
	res := dsec(t, mux, "sandbox", "fork", "sb-1", "-n", "3", "--timeout", "60", "--label", "g=1")
	if res.code != 0 || res.stdout != "sb-c0\nsb-c1\nsb-c2\n" || res.stderr != "snapshot snap-1, 3 sandboxes\n" {
		t.Errorf("fork: %+v", res)
	}
	if diff := cmp.Diff(api.ForkRequest{Count: 3, TimeoutS: 60, Labels: map[string]string{"g": "1"}}, fork); diff != "" {
		t.Errorf("fork request (-want +got):\n%s", diff)
	}
	res = dsec(t, mux, "sandbox", "fork", "sb-1", "-n", "0")
	if res.code != exitError || !strings.Contains(res.stderr, "(invalid_fork_count)") {
		t.Errorf("fork -n 0: %+v", res)
	}
	res = dsec(t, mux, "snapshot", "get", "snap-1")
	for _, want := range []string{"Trajectory:  run-42/task-7/rollout-3 at step 4", "Stored:      1.0 MiB", "Layers:      sha256:a"} {
		if res.code != 0 || !strings.Contains(res.stdout, want) {
			t.Errorf("snapshot get lacks %q: %+v", want, res)
		}
	}
	if res := dsec(t, mux, "snapshot", "get", "snap-2"); res.code != exitError || !strings.Contains(res.stderr, "(snapshot_not_found)") {
		t.Errorf("snapshot get of an unknown one: %+v", res)
	}
	if res := dsec(t, mux, "snapshot", "rm", "snap-1", "snap-2"); res.code != 0 || res.stdout != "snap-1\nsnap-2\n" || len(deleted) != 2 {
		t.Errorf("snapshot rm: %+v, deleted %v", res, deleted)
	}
}
