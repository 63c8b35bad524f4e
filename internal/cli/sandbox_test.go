package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

func TestSandboxCreate(t *testing.T) {
	sb := api.Sandbox{ID: "sb-1", Tier: "container", Image: "python:3.12", State: api.StateRunning, CreatedAt: testNow, ExpiresAt: testNow.Add(time.Minute)}
	var got api.CreateSandboxRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		decode(t, r, &got)
		writeJSON(w, http.StatusCreated, sb)
	})
	argv := []string{"sandbox", "create", "--tier", "container", "--image", "python:3.12", "--cpu", "0.5",
		"--memory", "512", "--disk", "1024", "--timeout", "60",
		"--env", "A=1", "--env", "B=x=y", "--label", "run=7", "--label", "group=g"}

	res := dsec(t, mux, argv...)
	if res.code != 0 || res.stdout != "sb-1\n" {
		t.Fatalf("got %+v, want the ID and exit 0", res)
	}
	want := api.CreateSandboxRequest{Tier: "container", Image: "python:3.12", CPU: 0.5, MemoryMB: 512, DiskMB: 1024, TimeoutS: 60,
		Env: map[string]string{"A": "1", "B": "x=y"}, Labels: map[string]string{"run": "7", "group": "g"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}

	res = dsec(t, mux, append([]string{"--json"}, argv...)...)
	var printed api.Sandbox
	if err := json.Unmarshal([]byte(res.stdout), &printed); err != nil || res.code != 0 {
		t.Fatalf("--json printed %q (exit %d): %v", res.stdout, res.code, err)
	}
	if diff := cmp.Diff(sb, printed); diff != "" {
		t.Errorf("--json mismatch (-want +got):\n%s", diff)
	}
}

func TestSandboxCreateLayers(t *testing.T) {
	var got []api.CreateSandboxRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		decode(t, r, &req)
		got = append(got, req)
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1"})
	})
	res := dsec(t, mux, "sandbox", "create", "--layer", "base=base/busybox:1.36", "--layer", "workspace=team/ws:1",
		"--layer", "toolkit=toolkit/wasm-tools:ab=c")
	if res.code != 0 || res.stdout != "sb-1\n" {
		t.Fatalf("got %+v", res)
	}
	want := []api.CreateSandboxRequest{{Layers: []api.ImageLayer{
		{Role: "base", ID: "base/busybox:1.36"}, {Role: "workspace", ID: "team/ws:1"}, {Role: "toolkit", ID: "toolkit/wasm-tools:ab=c"},
	}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request mismatch (-want +got):\n%s", diff)
	}
}

func TestBadKeyValue(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"env without =", []string{"sandbox", "create", "--env", "FOO"}, `--env "FOO": want KEY=VALUE`},
		{"label with empty key", []string{"sandbox", "create", "--label", "=v"}, `--label "=v": want KEY=VALUE`},
		{"ls label", []string{"sandbox", "ls", "--label", "x"}, `--label "x": want KEY=VALUE`},
		{"exec env", []string{"exec", "--env", "X", "sb-1", "--", "true"}, `--env "X": want KEY=VALUE`},
		{"run env", []string{"run", "--tier", "function", "--env", "X", "--", "true"}, `--env "X": want KEY=VALUE`},
		{"layer without =", []string{"sandbox", "create", "--layer", "base"}, `--layer "base": want ROLE=REF`},
		{"layer without ref", []string{"run", "--tier", "function", "--layer", "base=", "--", "true"}, `--layer "base=": want ROLE=REF`},
		{"layer and image", []string{"sandbox", "create", "--image", "x", "--layer", "base=b"}, `give --image or --layer, not both`},
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

func sandboxFixtures() []api.Sandbox {
	return []api.Sandbox{
		{ID: "sb-2", Tier: "container", Image: "python:3.12", State: api.StateRunning,
			CreatedAt: testNow.Add(-90 * time.Second), ExpiresAt: testNow.Add(4 * time.Minute),
			Labels: map[string]string{"run": "7", "group": "g"}},
		{ID: "sb-1", Tier: "function", Image: "", State: api.StateStopped,
			CreatedAt: testNow.Add(-3 * time.Hour), ExpiresAt: testNow.Add(-2 * time.Hour)},
	}
}

func TestSandboxList(t *testing.T) {
	var query map[string][]string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.Query()
		writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: sandboxFixtures()})
	})

	res := dsec(t, mux, "sandbox", "ls", "--label", "run=7", "--label", "group=g", "--state", "running", "--tier", "container")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	want := `ID    TIER       IMAGE        STATE    AGE  EXPIRES IN  LABELS
sb-2  container  python:3.12  running  1m   4m          group=g,run=7
sb-1  function   -            stopped  3h   -           -
`
	if diff := cmp.Diff(want, res.stdout); diff != "" {
		t.Errorf("table mismatch (-want +got):\n%s", diff)
	}
	wantQuery := map[string][]string{"label": {"group=g", "run=7"}, "state": {"running"}, "tier": {"container"}}
	if diff := cmp.Diff(wantQuery, query); diff != "" {
		t.Errorf("query mismatch (-want +got):\n%s", diff)
	}

	res = dsec(t, mux, "--json", "sb", "ls")
	var l api.SandboxList
	if err := json.Unmarshal([]byte(res.stdout), &l); err != nil {
		t.Fatalf("--json printed %q: %v", res.stdout, err)
	}
	if diff := cmp.Diff(api.SandboxList{Sandboxes: sandboxFixtures()}, l); diff != "" {
		t.Errorf("--json mismatch (-want +got):\n%s", diff)
	}
}

func TestSandboxListAll(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		fx := sandboxFixtures()
		if r.URL.Query().Get("page_token") == "" {
			writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: fx[:1], NextPageToken: "p2"})
			return
		}
		writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: fx[1:]})
	})
	res := dsec(t, mux, "sandbox", "ls")
	if strings.Count(res.stdout, "\n") != 2 || !strings.Contains(res.stderr, "--all") {
		t.Errorf("first page: stdout %q, stderr %q; want one row and a hint", res.stdout, res.stderr)
	}
	res = dsec(t, mux, "sandbox", "ls", "--all")
	if strings.Count(res.stdout, "\n") != 3 || res.stderr != "" {
		t.Errorf("--all: stdout %q, stderr %q; want two rows", res.stdout, res.stderr)
	}
}

func TestSandboxGetRemoveTimeout(t *testing.T) {
	sb := sandboxFixtures()[0]
	var deleted []string
	var timeout api.SetTimeoutRequest
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != sb.ID {
			writeError(w, http.StatusNotFound, "sandbox_not_found", "not_found", "sandbox "+r.PathValue("id")+" not found")
			return
		}
		writeJSON(w, http.StatusOK, sb)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "sb-x" {
			writeError(w, http.StatusNotFound, "sandbox_not_found", "not_found", "sandbox sb-x not found")
			return
		}
		deleted = append(deleted, r.PathValue("id"))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request) {
		decode(t, r, &timeout)
		writeJSON(w, http.StatusOK, sb)
	})

	res := dsec(t, mux, "sandbox", "get", "sb-2")
	if res.code != 0 || !strings.Contains(res.stdout, "State:      running") || !strings.Contains(res.stdout, "group=g,run=7") {
		t.Errorf("get printed %q (exit %d)", res.stdout, res.code)
	}
	res = dsec(t, mux, "sandbox", "get", "sb-9")
	if res.code != exitError || res.stderr != "dsec: sandbox sb-9 not found (sandbox_not_found)\n" {
		t.Errorf("get of a missing sandbox: exit %d, stderr %q", res.code, res.stderr)
	}

	res = dsec(t, mux, "sandbox", "rm", "sb-1", "sb-x", "sb-2")
	if diff := cmp.Diff([]string{"sb-1", "sb-2"}, deleted); diff != "" {
		t.Errorf("deleted mismatch (-want +got):\n%s", diff)
	}
	if res.code != exitError || res.stdout != "sb-1\nsb-2\n" || !strings.Contains(res.stderr, "sb-x: sandbox sb-x not found") {
		t.Errorf("rm: %+v", res)
	}

	res = dsec(t, mux, "sandbox", "timeout", "sb-2", "600")
	if res.code != 0 || timeout.TimeoutS != 600 {
		t.Errorf("timeout: %+v, request %+v", res, timeout)
	}
	res = dsec(t, mux, "sandbox", "timeout", "sb-2", "soon")
	if res.code != exitUsage {
		t.Errorf("timeout soon: exit %d, want 2", res.code)
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		argv []string
	}{
		{"unknown command", []string{"frobnicate"}},
		{"unknown flag", []string{"sandbox", "ls", "--nope"}},
		{"missing argument", []string{"sandbox", "get"}},
		{"extra argument", []string{"nodes", "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := dsec(t, nil, tt.argv...)
			if res.code != exitUsage || !strings.HasPrefix(res.stderr, "dsec: ") || !strings.Contains(res.stderr, "--help") {
				t.Errorf("got exit %d, stderr %q; want exit 2 with a hint", res.code, res.stderr)
			}
		})
	}
}
