// Package client is the Go client of DSec's REST API v1. It speaks the wire
// types of package api, streams command output (NDJSON or WebSocket) and
// file contents without buffering them, and turns every error response into
// an *Error that errors.Is can match against ErrNotFound and friends.
package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds a request that does not stream, unless WithTimeout
// says otherwise. Commands get their own run time on top of it.
const DefaultTimeout = 30 * time.Second

// Retries by default: how many, and how long a request and its retries
// may take in all (WithRetry, WithRetryBudget).
const (
	DefaultRetries     = 10
	DefaultRetryBudget = 2 * time.Minute
)

// Client talks to one DSec server. It is safe for concurrent use; reuse one
// Client so that connections are pooled.
type Client struct {
	// bases are the servers, scheme://host[/prefix] without a trailing
	// slash; cur indexes the one in use (see failover).
	bases   []string
	cur     atomic.Int32
	auth    []string
	agent   []string
	http    *http.Client
	retries int
	budget  time.Duration
	timeout time.Duration
	bufs    sync.Pool // *bytes.Buffer for response bodies
	lines   sync.Pool // *bufio.Reader for command streams
}

// Option configures a Client.
type Option func(*options)

type options struct {
	httpClient *http.Client
	userAgent  string
	retries    int
	budget     time.Duration
	timeout    time.Duration
}

// WithHTTPClient makes the client send its requests through hc. Its
// Timeout, if any, applies to whole streams too; prefer WithTimeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(o *options) { o.httpClient = hc }
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option {
	return func(o *options) { o.userAgent = ua }
}

// WithRetry sets how many times a request is sent again (default
// DefaultRetries; 0: never) when a retry is safe and may succeed:
//   - 429 (the server did nothing: it is overloaded or rate-limits the
//     token), except too_many_sandboxes, which waits for the caller to
//     delete sandboxes;
//   - 503 with Retry-After (the server did nothing and says when to come
//     back: a create that could not start for a transient reason), and
//     503 without it for idempotent methods (GET, PUT, DELETE);
//   - a failed connection, for idempotent methods, or for any request if
//     it failed before the request was sent (dialing).
//
// The wait before retry n is an exponential backoff (100 ms doubling, at
// most 5 s) or the server's Retry-After if longer, plus up to a quarter
// more at random, so that many clients told the same come back spread
// out. A Retry-After over a minute is not waited for. Streamed uploads
// are never retried, nor is a request once its retry budget is spent.
func WithRetry(max int) Option {
	return func(o *options) { o.retries = max }
}

// WithRetryBudget bounds the time a request and its retries take in all
// (default DefaultRetryBudget): no retry starts after it; the context's
// deadline bounds it too.
func WithRetryBudget(d time.Duration) Option {
	return func(o *options) { o.budget = d }
}

// WithTimeout sets the time limit of each attempt of a request that does
// not stream (default DefaultTimeout; 0 means none). Exec and WaitProcess
// add the command's own timeout to it. Streams (ExecStream, ExecWS,
// ReadFile, WriteFile) are bounded by their context only.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// New returns a client of the server at baseURL (e.g.
// "http://127.0.0.1:7878") that authenticates with token, if not empty.
// baseURL may name several API servers of one DSec, comma-separated
// ("http://a:7878,http://b:7878"): the client uses the first, and moves
// to the next when a request fails in a way it retries (WithRetry) and
// the cause is the server (it cannot be reached, or answers 503); the
// retry then goes there.
func New(baseURL, token string, opts ...Option) (*Client, error) {
	var bases []string
	for _, s := range strings.Split(baseURL, ",") {
		b, err := parseBase(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		bases = append(bases, b)
	}
	o := options{userAgent: "dsec-go-client", timeout: DefaultTimeout, retries: DefaultRetries, budget: DefaultRetryBudget}
	for _, opt := range opts {
		opt(&o)
	}
	if o.retries < 0 {
		return nil, errors.New("retry count must not be negative")
	}
	if o.timeout < 0 || o.budget < 0 {
		return nil, errors.New("timeout and retry budget must not be negative")
	}
	if o.httpClient == nil {
		o.httpClient = &http.Client{Transport: newTransport()}
	}
	c := &Client{
		bases:   bases,
		http:    o.httpClient,
		retries: o.retries,
		budget:  o.budget,
		timeout: o.timeout,
		bufs:    sync.Pool{New: func() any { return new(bytes.Buffer) }},
		lines:   sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }},
	}
	if token != "" {
		c.auth = []string{"Bearer " + token}
	}
	if o.userAgent != "" {
		c.agent = []string{o.userAgent}
	}
	return c, nil
}

// newTransport is tuned for many concurrent requests to one server.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0, // no global limit
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// parseBase checks one server URL and returns it without a trailing
// slash.
func parseBase(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("parsing server URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("server URL %q: want http[s]://host[:port]", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("server URL %q: must not have a query or fragment", s)
	}
	return u.Scheme + "://" + u.Host + strings.TrimRight(u.EscapedPath(), "/"), nil
}

// BaseURL returns the server URL the client talks to now.
func (c *Client) BaseURL() string { return c.bases[c.cur.Load()] }

// failover moves the client from server i (the one a failed attempt
// went to) to the next, unless another request moved it already.
func (c *Client) failover(i int32) {
	if len(c.bases) > 1 {
		c.cur.CompareAndSwap(i, (i+1)%int32(len(c.bases)))
	}
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }
