package client

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

func TestListSandboxesQuery(t *testing.T) {
	var got map[string][]string
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Query()
		writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: []api.Sandbox{{ID: "sb-1"}}})
	})
	l, err := c.ListSandboxes(context.Background(), ListOptions{
		Labels:    map[string]string{"run": "42", "env": "a=b"},
		State:     api.StateRunning,
		Tier:      api.TierContainer,
		Limit:     10,
		PageToken: "tok",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"label":      {"env=a=b", "run=42"},
		"state":      {"running"},
		"tier":       {"container"},
		"limit":      {"10"},
		"page_token": {"tok"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("query mismatch (-want +got):\n%s", diff)
	}
	if len(l.Sandboxes) != 1 {
		t.Errorf("got %d sandboxes, want 1", len(l.Sandboxes))
	}
}

func TestListAllSandboxes(t *testing.T) {
	pages := map[string]api.SandboxList{
		"":   {Sandboxes: []api.Sandbox{{ID: "a"}, {ID: "b"}}, NextPageToken: "p2"},
		"p2": {Sandboxes: []api.Sandbox{{ID: "c"}}, NextPageToken: "p3"},
		"p3": {Sandboxes: []api.Sandbox{{ID: "d"}}},
	}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("tier") != "vm" {
			t.Errorf("filter lost on page %q", r.URL.Query().Get("page_token"))
		}
		writeJSON(w, http.StatusOK, pages[r.URL.Query().Get("page_token")])
	})
	all, err := c.ListAllSandboxes(context.Background(), ListOptions{Tier: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range all {
		ids = append(ids, sb.ID)
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "d"}, ids); diff != "" {
		t.Errorf("IDs mismatch (-want +got):\n%s", diff)
	}
}

func TestListAllSandboxesLoop(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.SandboxList{NextPageToken: "same"})
	})
	if _, err := c.ListAllSandboxes(context.Background(), ListOptions{}); err == nil {
		t.Fatal("ListAllSandboxes succeeded on a server that repeats its page token")
	}
}

func TestCreateSandbox(t *testing.T) {
	req := api.CreateSandboxRequest{Tier: api.TierContainer, Image: "python:3.12", CPU: 0.5, MemoryMB: 512, Env: map[string]string{"A": "1"}, Labels: map[string]string{"run": "1"}}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		var got api.CreateSandboxRequest
		decodeStrict(t, r, &got)
		if diff := cmp.Diff(req, got); diff != "" {
			t.Errorf("request mismatch (-want +got):\n%s", diff)
		}
		if r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type = %q", r.Header.Get("Content-Type"))
		}
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-9", Tier: got.Tier, State: api.StateRunning})
	})
	sb, err := c.CreateSandbox(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb-9" || sb.State != api.StateRunning {
		t.Errorf("sandbox = %+v", sb)
	}
}

func TestSetTimeout(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		var got api.SetTimeoutRequest
		decodeStrict(t, r, &got)
		if r.URL.Path != "/v1/sandboxes/sb-1/timeout" || got.TimeoutS != 2 {
			t.Errorf("request %s %+v, want timeout_s 2", r.URL.Path, got)
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1"})
	})
	if _, err := c.SetTimeout(context.Background(), "sb-1", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

func TestEmptySandboxID(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s", r.URL)
	})
	if _, err := c.GetSandbox(context.Background(), ""); !errors.Is(err, errEmptyID) {
		t.Errorf("GetSandbox(\"\") error = %v", err)
	}
}

func TestSandboxIDEscaped(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.EscapedPath() != "/v1/sandboxes/a%2Fb" {
			t.Errorf("path %s", r.URL.EscapedPath())
		}
		w.WriteHeader(http.StatusNoContent)
	})
	if err := c.DeleteSandbox(context.Background(), "a/b"); err != nil {
		t.Fatal(err)
	}
}
