package client

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
)

func TestRetryRateLimitedThenSuccess(t *testing.T) {
	var calls atomic.Int32
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "rate_limited", Message: "slow down", Class: ClassRateLimited})
			return
		}
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1"})
	}, WithRetry(2))
	start := time.Now()
	sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Tier: api.TierFunction})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb-1" || calls.Load() != 2 {
		t.Errorf("got sandbox %q after %d calls, want sb-1 after 2", sb.ID, calls.Load())
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("retried after %v, want Retry-After's 1s honoured", d)
	}
}

func TestRetryGivesUp(t *testing.T) {
	var calls atomic.Int32
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "rate_limited", Message: "slow down", Class: ClassRateLimited})
	}, WithRetry(2))
	_, err := c.Nodes(context.Background())
	if !IsRateLimited(err) {
		t.Fatalf("Nodes error = %v, want rate limited", err)
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("server saw %d calls, want 3 (1 + 2 retries)", got)
	}
}

func TestRetryAfterPastDeadline(t *testing.T) {
	var calls atomic.Int32
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "30")
		writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "rate_limited", Message: "slow down", Class: ClassRateLimited})
	}, WithRetry(5))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Nodes(ctx)
	if !IsRateLimited(err) {
		t.Fatalf("Nodes error = %v, want rate limited", err)
	}
	if d := time.Since(start); d > time.Second || calls.Load() != 1 {
		t.Errorf("returned after %v and %d calls, want at once after 1", d, calls.Load())
	}
}

func TestNoRetryByDefault(t *testing.T) {
	var calls atomic.Int32
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "rate_limited", Message: "slow down"})
	})
	if _, err := c.Nodes(context.Background()); !IsRateLimited(err) {
		t.Fatalf("Nodes error = %v, want rate limited", err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("server saw %d calls, want 1", got)
	}
}

// dropConn closes the connection without answering.
func dropConn(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	conn.Close()
}

func TestRetryConnectionErrors(t *testing.T) {
	tests := []struct {
		name      string
		call      func(*Client) error
		wantCalls int32
		wantErr   bool
	}{
		{
			name: "GET is retried",
			call: func(c *Client) error {
				_, err := c.GetSandbox(context.Background(), "sb-1")
				return err
			},
			wantCalls: 3,
		},
		{
			name: "DELETE is retried",
			call: func(c *Client) error {
				return c.DeleteSandbox(context.Background(), "sb-1")
			},
			wantCalls: 3,
		},
		{
			name: "POST is not retried",
			call: func(c *Client) error {
				_, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
				return err
			},
			wantCalls: 1,
			wantErr:   true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) < 3 {
					dropConn(t, w)
					return
				}
				switch r.Method {
				case http.MethodDelete:
					w.WriteHeader(http.StatusNoContent)
				default:
					writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1"})
				}
			}, WithRetry(3))
			err := tt.call(c)
			if (err != nil) != tt.wantErr {
				t.Errorf("error = %v, want error: %v", err, tt.wantErr)
			}
			if got := calls.Load(); got != tt.wantCalls {
				t.Errorf("server saw %d calls, want %d", got, tt.wantCalls)
			}
		})
	}
}

func TestHeaders(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Authorization"); got != "Bearer secret" {
			t.Errorf("Authorization = %q", got)
		}
		if got := r.Header.Get("User-Agent"); got != "rl-loop/1" {
			t.Errorf("User-Agent = %q", got)
		}
		if got := r.Header.Get("Accept"); got != "application/json" {
			t.Errorf("Accept = %q", got)
		}
		writeJSON(w, http.StatusOK, api.VersionInfo{Version: "1.2.3", API: api.Version})
	}, WithUserAgent("rl-loop/1"))
	v, err := c.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v.Version != "1.2.3" {
		t.Errorf("Version = %q", v.Version)
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:7878", "ftp://host", "http://", "http://h/?q=1"} {
		if _, err := New(u, ""); err == nil {
			t.Errorf("New(%q) succeeded, want error", u)
		}
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, WithTimeout(50*time.Millisecond))
	start := time.Now()
	if _, err := c.Nodes(context.Background()); err == nil {
		t.Fatal("Nodes succeeded, want timeout")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("timed out after %v, want about 50ms", d)
	}
}
