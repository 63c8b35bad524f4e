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

// TestRetryDefault: a client retries by default; WithRetry(0) turns it
// off.
func TestRetryDefault(t *testing.T) {
	var calls atomic.Int32
	h := func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%2 == 1 {
			writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "overloaded", Message: "busy", Class: ClassRateLimited})
			return
		}
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1"})
	}
	if _, err := newTestClient(t, h).CreateSandbox(context.Background(), api.CreateSandboxRequest{}); err != nil || calls.Load() != 2 {
		t.Errorf("default client: %v after %d calls, want success after 2", err, calls.Load())
	}
	calls.Store(0)
	if _, err := newTestClient(t, h, WithRetry(0)).CreateSandbox(context.Background(), api.CreateSandboxRequest{}); !IsRateLimited(err) || calls.Load() != 1 {
		t.Errorf("WithRetry(0): %v after %d calls, want the 429 after 1", err, calls.Load())
	}
}

// TestRetryStatuses: which error answers are sent again, for which
// methods.
func TestRetryStatuses(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		code       string
		retryAfter string
		post       bool
		wantCalls  int32
	}{
		{name: "429 overloaded, POST", status: 429, code: "overloaded", retryAfter: "0", post: true, wantCalls: 2},
		{name: "429 too_many_sandboxes waits for deletes", status: 429, code: "too_many_sandboxes", retryAfter: "1", post: true, wantCalls: 1},
		{name: "503 with Retry-After, POST", status: 503, code: "sandbox_start_timeout", retryAfter: "0", post: true, wantCalls: 1},
		{name: "503 with Retry-After 1, POST", status: 503, code: "sandbox_start_timeout", retryAfter: "1", post: true, wantCalls: 2},
		{name: "503 without Retry-After, POST", status: 503, code: "agent_gone", post: true, wantCalls: 1},
		{name: "503 without Retry-After, GET", status: 503, code: "agent_gone", wantCalls: 2},
		{name: "500 is not retried", status: 500, code: "internal", wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					if tt.retryAfter != "" {
						w.Header().Set("Retry-After", tt.retryAfter)
					}
					writeJSON(w, tt.status, api.Error{Code: tt.code, Message: "no"})
					return
				}
				writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1"})
			})
			var err error
			if tt.post {
				_, err = c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
			} else {
				_, err = c.GetSandbox(context.Background(), "sb-1")
			}
			if got := calls.Load(); got != tt.wantCalls || (err == nil) != (tt.wantCalls == 2) {
				t.Errorf("%v after %d calls, want %d calls", err, got, tt.wantCalls)
			}
		})
	}
}

// TestRetryBackoffHonoursRetryAfter: waits are at least the server's
// Retry-After, spread over up to a quarter more, and grow exponentially
// without one.
func TestRetryBackoffHonoursRetryAfter(t *testing.T) {
	for i := 0; i < 1000; i++ {
		if d := backoff(0, 2*time.Second); d < 2*time.Second || d > 2500*time.Millisecond {
			t.Fatalf("backoff with Retry-After 2s = %v, want 2s–2.5s", d)
		}
		if d := backoff(3, 0); d < 400*time.Millisecond || d > 800*time.Millisecond {
			t.Fatalf("4th backoff = %v, want 400–800ms", d)
		}
		if d := backoff(10, time.Second); d < backoffMax || d > backoffMax*5/4 {
			t.Fatalf("11th backoff with Retry-After 1s = %v, want the cap %v and up to a quarter more", d, backoffMax)
		}
	}
	seen := map[time.Duration]bool{}
	for i := 0; i < 100; i++ {
		seen[backoff(0, time.Second)] = true
	}
	if len(seen) < 50 {
		t.Errorf("100 waits after Retry-After 1s took %d values: not spread", len(seen))
	}
}

// TestRetryBudget: no retry starts once a request's retry budget would
// be spent, however many retries are left.
func TestRetryBudget(t *testing.T) {
	var calls atomic.Int32
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "overloaded", Message: "busy", Class: ClassRateLimited})
	}, WithRetry(100), WithRetryBudget(2*time.Second))
	start := time.Now()
	_, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
	if !IsRateLimited(err) {
		t.Fatalf("error = %v, want the last 429", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v, want within the 2s budget", d)
	}
	if n := calls.Load(); n < 2 || n > 3 {
		t.Errorf("server saw %d calls, want 2 or 3 within 2s of 1s waits", n)
	}
}

// TestAttemptTimeoutNotRetried: an attempt that outlived the client's
// timeout is not repeated, even for a GET.
func TestAttemptTimeoutNotRetried(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	defer close(release)
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, WithTimeout(50*time.Millisecond))
	if _, err := c.GetSandbox(context.Background(), "sb-1"); err == nil {
		t.Fatal("GetSandbox succeeded, want its timeout")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("server saw %d calls, want 1", n)
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
