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

func TestNodes(t *testing.T) {
	nodes := api.NodeList{Nodes: []api.Node{{
		ID:    "node-a",
		Ready: true,
		Tiers: []api.TierInfo{
			{Name: "function", Available: true, Accelerator: "none"},
			{Name: "container", Available: true, Accelerator: "none"},
			{Name: "microvm", Available: true, Accelerator: "kvm"},
			{Name: "vm", Available: false, Reason: "no qemu"},
		},
		Capacity: api.Capacity{MaxSandboxes: 100},
		Usage:    api.Usage{Sandboxes: 3},
	}, {ID: "node-b", Tiers: []api.TierInfo{{Name: "vm", Available: true, Accelerator: "tcg"}}, Cordoned: true}}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, nodes)
	})
	res := dsec(t, h, "nodes")
	want := `ID      READY  TIERS                            SANDBOXES/MAX  PLACING
node-a  yes    function,container,microvm(kvm)  3/100          yes
node-b  no     vm(tcg)                          0/0            cordoned
`
	if diff := cmp.Diff(want, res.stdout); diff != "" {
		t.Errorf("table mismatch (-want +got):\n%s", diff)
	}
	res = dsec(t, h, "--json", "nodes")
	var got api.NodeList
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(nodes, got); diff != "" {
		t.Errorf("--json mismatch (-want +got):\n%s", diff)
	}
}

func TestVersion(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.VersionInfo{Version: "2.0.0", API: "v1", GoVersion: "go1.26.8"})
	})
	res := dsec(t, h, "version")
	if res.code != 0 || res.stdout != "client: 1.0.0-test\nserver: 2.0.0 (API v1, go1.26.8)\n" {
		t.Errorf("version: %+v", res)
	}
	res = dsec(t, h, "--json", "version")
	if res.code != 0 || !strings.Contains(res.stdout, `"client": "1.0.0-test"`) || !strings.Contains(res.stdout, `"version": "2.0.0"`) {
		t.Errorf("version --json: %+v", res)
	}

	// No server listens on the discard port.
	res = dsec(t, nil, "--url", "http://127.0.0.1:9", "version")
	if res.code != 0 || res.stdout != "client: 1.0.0-test\n" || !strings.HasPrefix(res.stderr, "server: unreachable") {
		t.Errorf("version without a server: %+v", res)
	}
}

func TestGlobalTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	start := time.Now()
	res := dsec(t, h, "--timeout", "100ms", "nodes")
	if res.code != exitError || time.Since(start) > 5*time.Second {
		t.Errorf("got %+v after %v, want a quick timeout error", res, time.Since(start))
	}
}
