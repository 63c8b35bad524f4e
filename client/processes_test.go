package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

func TestProcessRequests(t *testing.T) {
	type seen struct {
		Method, Path, Query, Body string
	}
	tests := []struct {
		name string
		call func(*Client) error
		want seen
	}{
		{
			name: "start",
			call: func(c *Client) error {
				_, err := c.StartProcess(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"server"}})
				return err
			},
			want: seen{"POST", "/v1/sandboxes/sb-1/processes", "", `{"cmd":["server"]}`},
		},
		{
			name: "list",
			call: func(c *Client) error { _, err := c.ListProcesses(context.Background(), "sb-1"); return err },
			want: seen{"GET", "/v1/sandboxes/sb-1/processes", "", ""},
		},
		{
			name: "get",
			call: func(c *Client) error { _, err := c.GetProcess(context.Background(), "sb-1", 42); return err },
			want: seen{"GET", "/v1/sandboxes/sb-1/processes/42", "", ""},
		},
		{
			name: "wait",
			call: func(c *Client) error {
				_, err := c.WaitProcess(context.Background(), "sb-1", 42, 1500*time.Millisecond)
				return err
			},
			want: seen{"POST", "/v1/sandboxes/sb-1/processes/42/wait", "timeout_s=1.5", ""},
		},
		{
			name: "stdin",
			call: func(c *Client) error { return c.SendStdin(context.Background(), "sb-1", 42, "line\n") },
			want: seen{"POST", "/v1/sandboxes/sb-1/processes/42/stdin", "", `{"data":"line\n"}`},
		},
		{
			name: "close stdin",
			call: func(c *Client) error { return c.CloseStdin(context.Background(), "sb-1", 42) },
			want: seen{"POST", "/v1/sandboxes/sb-1/processes/42/stdin/close", "", ""},
		},
		{
			name: "kill",
			call: func(c *Client) error { return c.KillProcess(context.Background(), "sb-1", 42, "TERM") },
			want: seen{"POST", "/v1/sandboxes/sb-1/processes/42/kill", "", `{"signal":"TERM"}`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				got = seen{r.Method, r.URL.Path, r.URL.RawQuery, string(body)}
				switch {
				case r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes/sb-1/processes":
					writeJSON(w, http.StatusOK, api.ProcessList{})
				case r.URL.Path == "/v1/sandboxes/sb-1/processes/42/wait":
					writeJSON(w, http.StatusOK, api.ExecResult{})
				case r.Method == http.MethodPost && r.URL.Path != "/v1/sandboxes/sb-1/processes":
					w.WriteHeader(http.StatusNoContent)
				default:
					writeJSON(w, http.StatusOK, api.Process{Pid: 42})
				}
			})
			if err := tt.call(c); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBadPid(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s", r.URL)
	})
	if _, err := c.GetProcess(context.Background(), "sb-1", 0); err == nil {
		t.Error("GetProcess with pid 0 succeeded")
	}
}

func TestHealthUnavailable(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health" {
			t.Errorf("path %s", r.URL.Path)
		}
		writeJSON(w, http.StatusServiceUnavailable, api.Error{Code: "no_nodes", Message: "no node is ready", Class: ClassUnavailable})
	})
	if _, err := c.Health(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Health error = %v, want unavailable", err)
	}
}
