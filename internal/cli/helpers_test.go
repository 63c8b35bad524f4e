package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// testNow is the clock of every test.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testEnv is a process environment with the variables vars, no terminal,
// a fixed clock and an empty data directory.
func testEnv(t *testing.T, vars map[string]string) env {
	return env{
		lookupEnv: func(k string) (string, bool) {
			v, ok := vars[k]
			return v, ok
		},
		isTerminal: func(io.Writer) bool { return false },
		now:        func() time.Time { return testNow },
		dataDir:    t.TempDir(),
	}
}

// result is what one dsec run printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// invocation runs dsec in-process.
type invocation struct {
	env   env
	stdin string
}

// run runs dsec with argv against a server running h (if not nil) and
// returns its output and exit code.
func (inv invocation) run(t *testing.T, h http.Handler, argv ...string) result {
	t.Helper()
	if h != nil {
		argv = append([]string{"--url", newServer(t, h)}, argv...)
	}
	root := newRoot(inv.env, "1.0.0-test")
	var stdout, stderr bytes.Buffer
	root.SetArgs(argv)
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetIn(strings.NewReader(inv.stdin))
	code := Execute(context.Background(), root)
	return result{stdout.String(), stderr.String(), code}
}

// dsec runs dsec with argv against a server running h in a test
// environment.
func dsec(t *testing.T, h http.Handler, argv ...string) result {
	t.Helper()
	return invocation{env: testEnv(t, nil)}.run(t, h, argv...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, class, msg string) {
	writeJSON(w, status, api.Error{Code: code, Message: msg, Class: class})
}

// decode decodes r's body into v, refusing unknown fields as the server
// does.
func decode(t *testing.T, r *http.Request, v any) {
	t.Helper()
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Errorf("decoding %s body: %v", r.URL.Path, err)
	}
}

// streamEvents answers an exec stream request with events as NDJSON.
func streamEvents(w http.ResponseWriter, events ...api.ExecEvent) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, ev := range events {
		_ = enc.Encode(ev)
		_ = http.NewResponseController(w).Flush()
	}
}

// exitEvents is the stream of a command that printed out and errOut and
// exited with code.
func exitEvents(out, errOut string, code int) []api.ExecEvent {
	return []api.ExecEvent{
		{Type: api.EventStart, Pid: 1},
		{Type: api.EventStdout, Data: out},
		{Type: api.EventStderr, Data: errOut},
		{Type: api.EventExit, Result: &api.ExecResult{ExitCode: code}},
	}
}

// newServer starts a test server running h and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
