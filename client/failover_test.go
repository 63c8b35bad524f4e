package client

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

// deadURL is the URL of a port nothing listens on (connections refused).
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// TestFailover: with several server URLs, a create (not idempotent, but
// never sent: the first server refuses connections) and a 503 move the
// client to the next server, where the call succeeds; the client stays
// there; a 429 does not move it (it is the token's, everywhere).
func TestFailover(t *testing.T) {
	var live, unavailable atomic.Int32
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		live.Add(1)
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1"})
	}))
	defer good.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unavailable.Add(1)
		writeJSON(w, http.StatusServiceUnavailable, api.Error{Code: "draining", Message: "going away", Class: ClassUnavailable})
	}))
	defer busy.Close()

	c, err := New(deadURL(t)+", "+good.URL, "tok", WithRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Tier: api.TierFunction})
	if err != nil || sb.ID != "sb-1" {
		t.Fatalf("create with the first server down: %+v, %v", sb, err)
	}
	if c.BaseURL() != good.URL || live.Load() != 1 {
		t.Errorf("client at %s after %d calls to the live server, want %s after 1", c.BaseURL(), live.Load(), good.URL)
	}

	c, err = New(busy.URL+","+good.URL, "tok", WithRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSandbox(context.Background(), "sb-1"); err != nil {
		t.Fatalf("get with the first server answering 503: %v", err)
	}
	if unavailable.Load() != 1 || c.BaseURL() != good.URL {
		t.Errorf("503s seen %d, client at %s; want 1 and %s", unavailable.Load(), c.BaseURL(), good.URL)
	}

	if _, err := New(good.URL+",ftp://x", "tok"); err == nil {
		t.Error("a bad URL among several was accepted")
	}
}

// TestNoFailoverOnRateLimit: a 429 retries on the same server.
func TestNoFailoverOnRateLimit(t *testing.T) {
	var first, second atomic.Int32
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first.Add(1) == 1 {
			writeJSON(w, http.StatusTooManyRequests, api.Error{Code: "rate_limited", Message: "slow down", Class: ClassRateLimited})
			return
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1"})
	}))
	defer a.Close()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		second.Add(1)
		writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1"})
	}))
	defer b.Close()
	c, err := New(a.URL+","+b.URL, "tok", WithRetry(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSandbox(context.Background(), "sb-1"); err != nil {
		t.Fatal(err)
	}
	if first.Load() != 2 || second.Load() != 0 {
		t.Errorf("calls: first server %d, second %d; want 2 and 0", first.Load(), second.Load())
	}
}

// TestKeyedCreateRetriedAfterLostAnswer: a create whose answer is lost
// (the server reads it, then drops the connection) is sent again when it
// carries a request_id, and not when it does not (it may have made a
// sandbox).
func TestKeyedCreateRetriedAfterLostAnswer(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // the answer is lost
			}
			return
		}
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1"})
	}))
	defer srv.Close()
	c, err := New(srv.URL, "tok", WithRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{}); err == nil || calls.Load() != 1 {
		t.Errorf("a create without request_id whose answer was lost: %v after %d calls, want an error after 1", err, calls.Load())
	}
	calls.Store(0)
	sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{RequestID: "r-1"})
	if err != nil || sb.ID != "sb-1" || calls.Load() != 2 {
		t.Errorf("a keyed create whose answer was lost: %+v, %v after %d calls, want sb-1 after 2", sb, err, calls.Load())
	}
}
