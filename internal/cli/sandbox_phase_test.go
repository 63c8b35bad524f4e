package cli

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

func TestSandboxPhases(t *testing.T) {
	var created []api.CreateSandboxRequest
	var moved []api.SetPhaseRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		decode(t, r, &req)
		created = append(created, req)
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1"})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/phase", func(w http.ResponseWriter, r *http.Request) {
		var req api.SetPhaseRequest
		decode(t, r, &req)
		moved = append(moved, req)
		if req.Phase == "setup" && !req.Back {
			writeError(w, http.StatusConflict, "phase_backwards", "conflict", "going back needs back=true")
			return
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: r.PathValue("id"), Phase: req.Phase})
	})
	file := filepath.Join(t.TempDir(), "phases.json")
	if err := os.WriteFile(file, []byte(`[{"name": "setup"}, {"name": "coding", "writable": ["/workspace"], "user": "1000"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	res := dsec(t, mux, "sandbox", "create", "--tier", "container", "--phases", "@"+file)
	if res.code != 0 || res.stdout != "sb-1\n" {
		t.Fatalf("create: %+v", res)
	}
	want := []api.Phase{{Name: "setup"}, {Name: "coding", Writable: []string{"/workspace"}, User: "1000"}}
	if len(created) != 1 || !cmp.Equal(want, created[0].Phases) {
		t.Errorf("phases sent: %+v", created)
	}
	res = dsec(t, mux, "sandbox", "phase", "sb-1", "coding")
	if res.code != 0 || res.stdout != "sb-1 is in phase coding\n" {
		t.Errorf("phase: %+v", res)
	}
	res = dsec(t, mux, "sandbox", "phase", "sb-1", "setup")
	if res.code != exitError || !strings.Contains(res.stderr, "back=true") {
		t.Errorf("phase back: %+v", res)
	}
	res = dsec(t, mux, "sandbox", "phase", "--back", "sb-1", "setup")
	if res.code != 0 || len(moved) != 3 || !moved[2].Back {
		t.Errorf("phase --back: %+v, %+v", res, moved)
	}
	res = dsec(t, mux, "sandbox", "create", "--phases", `[{"name": "a", "nope": 1}]`)
	if res.code != exitUsage || !strings.Contains(res.stderr, "--phases") {
		t.Errorf("bad --phases: %+v", res)
	}
}
