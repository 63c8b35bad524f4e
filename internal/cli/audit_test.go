package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
)

func TestAudit(t *testing.T) {
	var queries []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		writeJSON(w, http.StatusOK, api.AuditEventList{Events: []api.AuditEvent{
			{Sandbox: "sb-1", Time: time.Unix(0, 0), Pid: 7, Comm: "sh", Kind: "exec", Path: "/bin/sh", Verdict: "allowed", Severity: "info"},
			{Sandbox: "sb-1", Time: time.Unix(1, 0), Pid: 8, Comm: "mount", Kind: "syscall", Syscall: "mount", Path: "/mnt", Result: -1, Verdict: "denied", Severity: "high", Rule: "mount"},
			{Sandbox: "sb-1", Time: time.Unix(2, 0), Pid: 9, Comm: "sed", Kind: "syscall", Syscall: "rename", Path: "/w/sedAb12", Target: "/w/x_test.go", Verdict: "allowed", Severity: "high", Rule: "test-tampering"},
		}})
	})
	res := dsec(t, mux, "audit", "sb-1", "--rules", "--limit", "5")
	if res.code != 0 || strings.Count(res.stdout, "\n") != 3 || !strings.Contains(res.stdout, "mount") || strings.Contains(res.stdout, "/bin/sh") ||
		!strings.Contains(res.stdout, "/w/sedAb12 → /w/x_test.go") {
		t.Errorf("audit --rules: %+v", res)
	}
	if len(queries) != 1 || queries[0] != "limit=5" {
		t.Errorf("queries %v", queries)
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}/integrity", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.IntegrityReport{Sandbox: "sb-1", Phases: []api.PhaseChange{{Phase: "setup"}, {Phase: "coding"}},
			Events: 9, Denied: 2, Suspicious: true, Monitored: true,
			Rules: []api.RuleCount{{Rule: "mount", Severity: "high", Count: 2}}, BySeverity: map[string]int{"high": 2}})
	})
	res = dsec(t, mux, "audit", "--integrity", "sb-1")
	if res.code != 0 || !strings.Contains(res.stdout, "SUSPICIOUS") || !strings.Contains(res.stdout, "setup → coding") ||
		!strings.Contains(res.stdout, "refused: 2") || !strings.Contains(res.stdout, "mount") {
		t.Errorf("audit --integrity: %+v", res)
	}
	res = dsec(t, mux, "--json", "audit", "sb-1")
	var evs []api.AuditEvent
	if err := json.Unmarshal([]byte(res.stdout), &evs); err != nil || len(evs) != 3 {
		t.Errorf("audit --json: %+v (%v)", res, err)
	}
}

// TestAuditFollow: --follow prints the stream's events as they come
// (NDJSON with --json) and ends with it.
func TestAuditFollow(t *testing.T) {
	var query string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/events/stream", func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.AuditEvent{Sandbox: "sb-1", Time: time.Unix(0, 0), Kind: "exec", Path: "/bin/sh", Verdict: "allowed", Severity: "info"})
		w.(http.Flusher).Flush()
		enc.Encode(api.AuditEvent{Sandbox: "sb-1", Time: time.Unix(1, 0), Kind: "syscall", Syscall: "mount", Path: "/mnt", Verdict: "denied", Severity: "high", Rule: "mount"})
	})
	res := dsec(t, mux, "audit", "-f", "--skip", "3", "sb-1")
	if res.code != 0 || !strings.Contains(res.stdout, "/bin/sh") || !strings.Contains(res.stdout, "denied") || query != "skip=3" {
		t.Errorf("audit --follow: %+v (query %q)", res, query)
	}
	res = dsec(t, mux, "--json", "audit", "--follow", "--rules", "sb-1")
	var e api.AuditEvent
	if res.code != 0 || strings.Count(res.stdout, "\n") != 1 || json.Unmarshal([]byte(res.stdout), &e) != nil || e.Rule != "mount" {
		t.Errorf("audit --follow --json --rules: %+v", res)
	}
}
