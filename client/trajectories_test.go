package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

const trajID = "run-42/task-7/rollout-3"

// TestTrajectoryPathsEscaped: a trajectory ID with '/' travels as one
// path segment on every route, and a blob digest's ':' is kept.
func TestTrajectoryPathsEscaped(t *testing.T) {
	var got []string
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/resume"):
			writeJSON(w, http.StatusCreated, api.ResumeResult{})
		case strings.HasSuffix(r.URL.Path, "/steps"):
			writeJSON(w, http.StatusOK, api.TrajectorySteps{})
		case strings.Contains(r.URL.Path, "/blobs/"), strings.HasSuffix(r.URL.Path, "/export"):
			_, _ = io.WriteString(w, "x")
		default:
			writeJSON(w, http.StatusOK, api.Trajectory{ID: trajID})
		}
	})
	ctx := context.Background()
	if tr, err := c.Trajectory(ctx, trajID); err != nil || tr.ID != trajID {
		t.Fatalf("Trajectory = %+v, %v", tr, err)
	}
	if _, err := c.TrajectorySteps(ctx, trajID, 5, 10); err != nil {
		t.Fatal(err)
	}
	if err := c.ExportTrajectory(ctx, trajID, io.Discard); err != nil {
		t.Fatal(err)
	}
	rc, err := c.TrajectoryBlob(ctx, trajID, "sha256:abc")
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, err := c.Resume(ctx, trajID, api.ResumeRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTrajectory(ctx, trajID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, "snap-1"); err != nil {
		t.Fatal(err)
	}
	const esc = "/v1/trajectories/run-42%2Ftask-7%2Frollout-3"
	want := []string{
		"GET " + esc + "?",
		"GET " + esc + "/steps?after=5&limit=10",
		"GET " + esc + "/export?",
		"GET " + esc + "/blobs/sha256:abc?",
		"POST " + esc + "/resume?",
		"DELETE " + esc + "?",
		"DELETE /v1/snapshots/snap-1?",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests mismatch (-want +got):\n%s", diff)
	}
}

func TestEmptyTrajectoryID(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s", r.URL)
	})
	ctx := context.Background()
	if _, err := c.Trajectory(ctx, ""); !errors.Is(err, errEmptyTrajectoryID) {
		t.Errorf("Trajectory(\"\") error = %v", err)
	}
	if _, err := c.Resume(ctx, "", api.ResumeRequest{}); !errors.Is(err, errEmptyTrajectoryID) {
		t.Errorf("Resume(\"\") error = %v", err)
	}
	if _, err := c.GetSnapshot(ctx, ""); !errors.Is(err, errEmptySnapshotID) {
		t.Errorf("GetSnapshot(\"\") error = %v", err)
	}
	if _, err := c.TrajectoryBlob(ctx, trajID, ""); err == nil {
		t.Error("TrajectoryBlob with no digest succeeded")
	}
}

func TestTrajectoryNotFound(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, api.Error{Code: "trajectory_not_found", Message: "no trajectory run-1", Class: ClassNotFound})
	})
	_, err := c.Trajectory(context.Background(), "run-1")
	var e *Error
	if !IsNotFound(err) || !errors.As(err, &e) || e.Code != "trajectory_not_found" {
		t.Fatalf("error = %v, want not found with code trajectory_not_found", err)
	}
	// The export's error comes before any byte is written.
	var buf bytes.Buffer
	if err := c.ExportTrajectory(context.Background(), "run-1", &buf); !IsNotFound(err) || buf.Len() != 0 {
		t.Errorf("export error = %v with %d bytes written", err, buf.Len())
	}
}

func TestResumeRequest(t *testing.T) {
	req := api.ResumeRequest{SecretEnv: map[string]string{"KEY": "v"}, OnDivergence: api.DivergenceContinue, Tier: "container", FromScratch: true, TimeoutS: 60}
	res := api.ResumeResult{Sandbox: api.Sandbox{ID: "sb-2", Trajectory: trajID, Incarnation: 2}, Replayed: 7, Skipped: 3,
		Divergence: &api.Divergence{Step: 5, Kind: api.KindExec, Logged: "exit 0", Replayed: "exit 1"}}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		var got api.ResumeRequest
		decodeStrict(t, r, &got)
		if diff := cmp.Diff(req, got); diff != "" {
			t.Errorf("request mismatch (-want +got):\n%s", diff)
		}
		writeJSON(w, http.StatusCreated, res)
	})
	got, err := c.Resume(context.Background(), trajID, req)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(res, got); diff != "" {
		t.Errorf("result mismatch (-want +got):\n%s", diff)
	}
}

// TestForkResumeRetries: a fork or resume refused with 503 and
// Retry-After made nothing and is sent again; without Retry-After it may
// have made something, and is not.
func TestForkResumeRetries(t *testing.T) {
	for _, retryAfter := range []bool{true, false} {
		var calls atomic.Int32
		c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1)%2 == 1 || !retryAfter {
				if retryAfter {
					w.Header().Set("Retry-After", "1")
				}
				writeJSON(w, http.StatusServiceUnavailable, api.Error{Code: "no_nodes", Message: "busy", Class: ClassUnavailable})
				return
			}
			if strings.HasSuffix(r.URL.Path, "/fork") {
				writeJSON(w, http.StatusCreated, api.ForkResult{Sandboxes: []api.Sandbox{{ID: "c1"}}})
				return
			}
			writeJSON(w, http.StatusCreated, api.ResumeResult{Sandbox: api.Sandbox{ID: "sb-2"}})
		}, WithRetry(1))
		_, ferr := c.Fork(context.Background(), "sb-1", api.ForkRequest{Count: 1})
		_, rerr := c.Resume(context.Background(), trajID, api.ResumeRequest{})
		if retryAfter {
			if ferr != nil || rerr != nil || calls.Load() != 4 {
				t.Errorf("with Retry-After: fork %v, resume %v after %d calls; want both to succeed after 4", ferr, rerr, calls.Load())
			}
			continue
		}
		if !errors.Is(ferr, ErrUnavailable) || !errors.Is(rerr, ErrUnavailable) || calls.Load() != 2 {
			t.Errorf("without Retry-After: fork %v, resume %v after %d calls; want both unavailable after 2", ferr, rerr, calls.Load())
		}
	}
}

func TestAllTrajectorySteps(t *testing.T) {
	pages := map[string]api.TrajectorySteps{
		"":  {Steps: []api.TrajectoryStep{{Step: 1}, {Step: 2}}, NextPageToken: "2"},
		"2": {Steps: []api.TrajectoryStep{{Step: 3}}, NextPageToken: "3"},
		"3": {Steps: []api.TrajectoryStep{{Step: 4}}},
	}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, pages[r.URL.Query().Get("after")])
	})
	var steps []int
	for s, err := range c.AllTrajectorySteps(context.Background(), trajID, 0) {
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, s.Step)
	}
	if diff := cmp.Diff([]int{1, 2, 3, 4}, steps); diff != "" {
		t.Errorf("steps mismatch (-want +got):\n%s", diff)
	}
}

// TestAllTrajectoryStepsStuck: a page token that does not move forward
// is an error, not an endless loop.
func TestAllTrajectoryStepsStuck(t *testing.T) {
	var calls atomic.Int32
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeJSON(w, http.StatusOK, api.TrajectorySteps{Steps: []api.TrajectoryStep{{Step: 1}}, NextPageToken: "1"})
	})
	var last error
	n := 0
	for _, err := range c.AllTrajectorySteps(context.Background(), trajID, 1) {
		n++
		last = err
	}
	if last == nil || calls.Load() != 1 || n != 2 {
		t.Errorf("got %d items, last error %v, after %d calls; want the step, then an error, after 1 call", n, last, calls.Load())
	}
}

func TestExportTrajectory(t *testing.T) {
	steps := []api.TrajectoryStep{
		{Trajectory: trajID, Step: 1, Kind: api.KindCreate, Create: &api.StepCreate{SecretEnv: []string{"KEY"}}},
		{Trajectory: trajID, Step: 2, Kind: api.KindExec, Pure: true, Exec: &api.StepExec{ExitCode: 0, OutputDigest: "sha256:1"}},
	}
	var body bytes.Buffer
	for _, s := range steps {
		b, _ := jsonLine(s)
		body.Write(b)
	}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "application/x-ndjson" {
			t.Errorf("Accept = %q", r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(body.Bytes())
	})
	var out bytes.Buffer
	if err := c.ExportTrajectory(context.Background(), trajID, &out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), body.Bytes()) {
		t.Errorf("export wrote %q, want %q", out.String(), body.String())
	}
	got, err := ReadTrajectoryExport(&out)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(steps, got); diff != "" {
		t.Errorf("steps mismatch (-want +got):\n%s", diff)
	}
	if _, err := ReadTrajectoryExport(strings.NewReader("{\"step\":1}\n{bad\n")); err == nil {
		t.Error("ReadTrajectoryExport took a broken line")
	}
}

func TestSnapshotAndFork(t *testing.T) {
	snap := api.Snapshot{ID: "snap-1", Sandbox: "sb-1", Step: 4, Tier: "container", Layers: []string{"sha256:l"}, Bytes: 10}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb-1/snapshot":
			if r.ContentLength > 0 {
				t.Errorf("snapshot sent a body of %d bytes", r.ContentLength)
			}
			writeJSON(w, http.StatusCreated, snap)
		case "POST /v1/sandboxes/sb-1/fork":
			var req api.ForkRequest
			decodeStrict(t, r, &req)
			if req.Count != 3 || req.TimeoutS != 60 || req.Labels["g"] != "1" {
				t.Errorf("fork request %+v", req)
			}
			writeJSON(w, http.StatusCreated, api.ForkResult{Snapshot: snap, Sandboxes: []api.Sandbox{{ID: "a"}, {ID: "b"}, {ID: "c"}}})
		case "GET /v1/snapshots/snap-1":
			writeJSON(w, http.StatusOK, snap)
		default:
			writeJSON(w, http.StatusNotFound, api.Error{Code: "snapshot_not_found", Message: "no", Class: ClassNotFound})
		}
	})
	ctx := context.Background()
	s, err := c.Snapshot(ctx, "sb-1")
	if err != nil || s.ID != "snap-1" {
		t.Fatalf("Snapshot = %+v, %v", s, err)
	}
	f, err := c.Fork(ctx, "sb-1", api.ForkRequest{Count: 3, TimeoutS: 60, Labels: map[string]string{"g": "1"}})
	if err != nil || len(f.Sandboxes) != 3 || f.Snapshot.ID != "snap-1" {
		t.Fatalf("Fork = %+v, %v", f, err)
	}
	if g, err := c.GetSnapshot(ctx, "snap-1"); err != nil || !cmp.Equal(g, snap) {
		t.Fatalf("GetSnapshot = %+v, %v", g, err)
	}
	if _, err := c.GetSnapshot(ctx, "snap-2"); !IsNotFound(err) {
		t.Errorf("GetSnapshot of an unknown one: %v", err)
	}
}
