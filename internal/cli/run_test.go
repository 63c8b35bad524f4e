package cli

import (
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

// runServer fakes the three calls of dsec run.
type runServer struct {
	mu      sync.Mutex
	created []api.CreateSandboxRequest
	execs   []api.ExecRequest
	deleted []string
}

func (s *runServer) handler(t *testing.T, stream http.HandlerFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		decode(t, r, &req)
		s.mu.Lock()
		s.created = append(s.created, req)
		s.mu.Unlock()
		if req.Tier == "vm" {
			writeError(w, http.StatusUnprocessableEntity, "tier_unavailable", "unsupported", "no node runs tier vm")
			return
		}
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-run", Tier: req.Tier, State: api.StateRunning})
	})
	mux.HandleFunc("POST /v1/sandboxes/sb-run/exec/stream", func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		decode(t, r, &req)
		s.mu.Lock()
		s.execs = append(s.execs, req)
		s.mu.Unlock()
		stream(w, r)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.deleted = append(s.deleted, r.PathValue("id"))
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func TestRun(t *testing.T) {
	tests := []struct {
		name        string
		argv        []string
		stream      http.HandlerFunc
		want        result
		wantCreate  api.CreateSandboxRequest
		wantExec    []api.ExecRequest
		wantDeleted []string
	}{
		{
			name: "command fails",
			argv: []string{"run", "--tier", "container", "--image", "python:3.12", "--memory", "512", "--timeout", "10", "--env", "A=1", "--", "python", "-c", "exit(7)"},
			stream: func(w http.ResponseWriter, r *http.Request) {
				streamEvents(w, exitEvents("out\n", "err\n", 7)...)
			},
			want:        result{stdout: "out\n", stderr: "err\n", code: 7},
			wantCreate:  api.CreateSandboxRequest{Tier: "container", Image: "python:3.12", MemoryMB: 512, TimeoutS: 10 + runGrace, Env: map[string]string{"A": "1"}},
			wantExec:    []api.ExecRequest{{Cmd: []string{"python", "-c", "exit(7)"}, TimeoutS: 10}},
			wantDeleted: []string{"sb-run"},
		},
		{
			name: "command succeeds",
			argv: []string{"run", "--tier", "function", "--", "echo", "hi"},
			stream: func(w http.ResponseWriter, r *http.Request) {
				streamEvents(w, exitEvents("hi\n", "", 0)...)
			},
			want:        result{stdout: "hi\n"},
			wantCreate:  api.CreateSandboxRequest{Tier: "function"},
			wantExec:    []api.ExecRequest{{Cmd: []string{"echo", "hi"}}},
			wantDeleted: []string{"sb-run"},
		},
		{
			name: "inline layers",
			argv: []string{"run", "--tier", "function", "--layer", "base=base/busybox:1", "--layer", "workspace=sha256:ab", "--", "cat", "/w/f"},
			stream: func(w http.ResponseWriter, r *http.Request) {
				streamEvents(w, exitEvents("f\n", "", 0)...)
			},
			want: result{stdout: "f\n"},
			wantCreate: api.CreateSandboxRequest{Tier: "function", Layers: []api.ImageLayer{
				{Role: "base", ID: "base/busybox:1"}, {Role: "workspace", ID: "sha256:ab"}}},
			wantExec:    []api.ExecRequest{{Cmd: []string{"cat", "/w/f"}}},
			wantDeleted: []string{"sb-run"},
		},
		{
			name: "exec fails",
			argv: []string{"run", "--tier", "function", "--", "x"},
			stream: func(w http.ResponseWriter, r *http.Request) {
				writeError(w, http.StatusInternalServerError, "internal", "internal", "internal error")
			},
			want:        result{stderr: "dsec: internal error (internal)\n", code: exitError},
			wantCreate:  api.CreateSandboxRequest{Tier: "function"},
			wantExec:    []api.ExecRequest{{Cmd: []string{"x"}}},
			wantDeleted: []string{"sb-run"},
		},
		{
			name: "stream cut",
			argv: []string{"run", "--tier", "function", "--", "x"},
			stream: func(w http.ResponseWriter, r *http.Request) {
				streamEvents(w, api.ExecEvent{Type: api.EventStart})
			},
			want:        result{stderr: "dsec: command stream ended before the exit event: unexpected EOF\n", code: exitError},
			wantCreate:  api.CreateSandboxRequest{Tier: "function"},
			wantExec:    []api.ExecRequest{{Cmd: []string{"x"}}},
			wantDeleted: []string{"sb-run"},
		},
		{
			name:       "create fails",
			argv:       []string{"run", "--tier", "vm", "--", "x"},
			want:       result{stderr: "dsec: no node runs tier vm (tier_unavailable)\n", code: exitError},
			wantCreate: api.CreateSandboxRequest{Tier: "vm"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s runServer
			got := dsec(t, s.handler(t, tt.stream), tt.argv...)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(result{})); diff != "" {
				t.Errorf("result mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]api.CreateSandboxRequest{tt.wantCreate}, s.created); diff != "" {
				t.Errorf("create mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantExec, s.execs); diff != "" {
				t.Errorf("exec mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantDeleted, s.deleted); diff != "" {
				t.Errorf("deleted mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunNeedsTier(t *testing.T) {
	res := dsec(t, nil, "run", "--", "ls")
	if res.code != exitUsage || !strings.Contains(res.stderr, "--tier is required") {
		t.Errorf("got %+v, want a usage error about --tier", res)
	}
}

// TestRunInterrupted sends this process SIGINT while the command runs, as
// Ctrl-C would; dsec run has the signal then, not the test binary.
func TestRunInterrupted(t *testing.T) {
	var s runServer
	h := s.handler(t, func(w http.ResponseWriter, r *http.Request) {
		streamEvents(w, api.ExecEvent{Type: api.EventStart})
		if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
			t.Error(err)
		}
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("dsec run did not hang up on SIGINT")
		}
	})
	res := dsec(t, h, "run", "--tier", "function", "--", "sleep", "100")
	if res.code != exitSignal || res.stderr != "dsec: interrupted\n" {
		t.Errorf("got %+v, want exit 130", res)
	}
	if diff := cmp.Diff([]string{"sb-run"}, s.deleted); diff != "" {
		t.Errorf("deleted mismatch (-want +got):\n%s", diff)
	}
}
