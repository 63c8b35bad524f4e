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
	"time"
)

// DefaultTimeout bounds a request that does not stream, unless WithTimeout
// says otherwise. Commands get their own run time on top of it.
const DefaultTimeout = 30 * time.Second

// Client talks to one DSec server. It is safe for concurrent use; reuse one
// Client so that connections are pooled.
type Client struct {
	base    string // scheme://host[/prefix], no trailing slash
	auth    []string
	agent   []string
	http    *http.Client
	retries int
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

// WithRetry retries a request up to max more times when the server answers
// 429 (after its Retry-After, or a bounded backoff) and, for idempotent
// methods only, when the connection fails. Streamed uploads are never
// retried. Default 0: no retries.
func WithRetry(max int) Option {
	return func(o *options) { o.retries = max }
}

// WithTimeout sets the time limit of requests that do not stream (default
// DefaultTimeout; 0 means none). Exec and WaitProcess add the command's own
// timeout to it. Streams (ExecStream, ExecWS, ReadFile, WriteFile) are
// bounded by their context only.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// New returns a client of the server at baseURL (e.g.
// "http://127.0.0.1:7878") that authenticates with token, if not empty.
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("parsing server URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: want http[s]://host[:port]", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("server URL %q: must not have a query or fragment", baseURL)
	}
	o := options{userAgent: "dsec-go-client", timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.retries < 0 {
		return nil, errors.New("retry count must not be negative")
	}
	if o.timeout < 0 {
		return nil, errors.New("timeout must not be negative")
	}
	if o.httpClient == nil {
		o.httpClient = &http.Client{Transport: newTransport()}
	}
	c := &Client{
		base:    u.Scheme + "://" + u.Host + strings.TrimRight(u.EscapedPath(), "/"),
		http:    o.httpClient,
		retries: o.retries,
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

// BaseURL returns the server URL the client talks to.
func (c *Client) BaseURL() string { return c.base }

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }
