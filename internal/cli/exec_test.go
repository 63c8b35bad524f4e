package cli

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

// execServer answers exec streams of sandbox sb-1 with the events reply
// returns for each request, and records the requests.
type execServer struct {
	mu   sync.Mutex
	reqs []api.ExecRequest
}

func (s *execServer) handler(t *testing.T, reply func(api.ExecRequest) []api.ExecEvent) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec/stream", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "sb-1" {
			writeError(w, http.StatusNotFound, "sandbox_not_found", "not_found", "sandbox "+r.PathValue("id")+" not found")
			return
		}
		var req api.ExecRequest
		decode(t, r, &req)
		s.mu.Lock()
		s.reqs = append(s.reqs, req)
		s.mu.Unlock()
		streamEvents(w, reply(req)...)
	})
	return mux
}

func TestExec(t *testing.T) {
	tests := []struct {
		name    string
		stdin   string
		argv    []string
		events  []api.ExecEvent
		wantReq api.ExecRequest
		want    result
	}{
		{
			name:    "exit code and streams",
			argv:    []string{"exec", "--env", "A=1", "--env", "B=2", "--cwd", "/w", "sb-1", "--", "sh", "-c", "echo hi; exit 3"},
			events:  exitEvents("hi\n", "warn\n", 3),
			wantReq: api.ExecRequest{Cmd: []string{"sh", "-c", "echo hi; exit 3"}, Env: map[string]string{"A": "1", "B": "2"}, Cwd: "/w"},
			want:    result{stdout: "hi\n", stderr: "warn\n", code: 3},
		},
		{
			name:    "flags after the sandbox",
			argv:    []string{"exec", "sb-1", "--timeout", "2.5", "--", "ls", "-la"},
			events:  exitEvents("", "", 0),
			wantReq: api.ExecRequest{Cmd: []string{"ls", "-la"}, TimeoutS: 2.5},
			want:    result{code: 0},
		},
		{
			name:    "no dash",
			argv:    []string{"exec", "sb-1", "true"},
			events:  exitEvents("", "", 0),
			wantReq: api.ExecRequest{Cmd: []string{"true"}},
		},
		{
			name:    "command line",
			argv:    []string{"exec", "sb-1", "--", "echo $HOME | wc -c"},
			events:  exitEvents("6\n", "", 0),
			wantReq: api.ExecRequest{Command: "echo $HOME | wc -c"},
			want:    result{stdout: "6\n"},
		},
		{
			name:    "stdin",
			stdin:   "some input",
			argv:    []string{"exec", "--stdin", "sb-1", "--", "cat"},
			events:  exitEvents("some input", "", 0),
			wantReq: api.ExecRequest{Cmd: []string{"cat"}, Stdin: "some input"},
			want:    result{stdout: "some input"},
		},
		{
			name: "timed out",
			argv: []string{"exec", "sb-1", "--", "sleep", "100"},
			events: []api.ExecEvent{{Type: api.EventStart}, {Type: api.EventExit,
				Result: &api.ExecResult{ExitCode: -1, TimedOut: true, Error: "timeout"}}},
			wantReq: api.ExecRequest{Cmd: []string{"sleep", "100"}},
			want:    result{stderr: "dsec: command timed out\n", code: exitTimedOut},
		},
		{
			name: "killed",
			argv: []string{"exec", "sb-1", "--", "x"},
			events: []api.ExecEvent{{Type: api.EventExit,
				Result: &api.ExecResult{ExitCode: -1, Error: "killed"}}},
			wantReq: api.ExecRequest{Cmd: []string{"x"}},
			want:    result{stderr: "dsec: command ended without an exit status: killed\n", code: exitError},
		},
		{
			name:    "error event",
			argv:    []string{"exec", "sb-1", "--", "x"},
			events:  []api.ExecEvent{{Type: api.EventError, Error: &api.Error{Code: "sandbox_lost", Message: "the sandbox's node went away", Class: "unavailable"}}},
			wantReq: api.ExecRequest{Cmd: []string{"x"}},
			want:    result{stderr: "dsec: the sandbox's node went away (sandbox_lost)\n", code: exitError},
		},
		{
			name:    "json prints the events",
			argv:    []string{"--json", "exec", "sb-1", "--", "x"},
			events:  exitEvents("o", "e", 5),
			wantReq: api.ExecRequest{Cmd: []string{"x"}},
			want: result{stdout: `{"type":"start","pid":1}` + "\n" + `{"type":"stdout","data":"o"}` + "\n" +
				`{"type":"stderr","data":"e"}` + "\n" + `{"type":"exit","result":{"exit_code":5,"stdout":"","stderr":"","duration_ms":0}}` + "\n", code: 5},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s execServer
			h := s.handler(t, func(api.ExecRequest) []api.ExecEvent { return tt.events })
			got := invocation{env: testEnv(t, nil), stdin: tt.stdin}.run(t, h, tt.argv...)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(result{})); diff != "" {
				t.Errorf("result mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]api.ExecRequest{tt.wantReq}, s.reqs); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	tests := []struct {
		name     string
		argv     []string
		wantCode int
		wantErr  string
	}{
		{"unknown sandbox", []string{"exec", "sb-9", "--", "true"}, exitError, "dsec: sandbox sb-9 not found (sandbox_not_found)\n"},
		{"no command", []string{"exec", "sb-1", "--"}, exitUsage, "no command given"},
		{"no sandbox", []string{"exec", "--", "ls"}, exitUsage, "want 1 argument(s) before the command, got 0"},
		{"two sandboxes", []string{"exec", "sb-1", "sb-2", "--", "ls"}, exitUsage, "want 1 argument(s) before the command, got 2"},
		{"unknown flag in command without dash", []string{"exec", "sb-1", "ls", "-la"}, exitUsage, "unknown shorthand flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s execServer
			res := dsec(t, s.handler(t, func(api.ExecRequest) []api.ExecEvent { return exitEvents("", "", 0) }), tt.argv...)
			if res.code != tt.wantCode || !strings.Contains(res.stderr, tt.wantErr) {
				t.Errorf("got exit %d, stderr %q; want %d and %q", res.code, res.stderr, tt.wantCode, tt.wantErr)
			}
		})
	}
}
