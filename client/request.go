package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// Header values, shared read-only by all requests so that setting them
// allocates nothing.
var (
	hdrJSON   = []string{"application/json"}
	hdrNDJSON = []string{"application/x-ndjson"}
	hdrOctet  = []string{"application/octet-stream"}
)

const (
	// maxPooledBuffer keeps huge responses from pinning memory in the pool.
	maxPooledBuffer = 1 << 20
	// maxRetryAfter is the longest Retry-After the client waits out; a
	// longer one is returned to the caller as the error it is.
	maxRetryAfter = time.Minute
	backoffBase   = 100 * time.Millisecond
	backoffMax    = 5 * time.Second
)

// request describes one API call.
type request struct {
	method string
	path   string // starts with /v1/ and includes the query
	body   []byte // JSON body, resent on retries
	stream io.Reader
	size   int64 // length of stream, or -1 if unknown
	accept []string
	ctype  []string
	// timeout bounds each attempt, until the response body is closed; 0:
	// only ctx does.
	timeout time.Duration
	// noRetry sends the request once (a probe that reports a state).
	noRetry bool
	// keyed: the request carries an idempotency key (a create's
	// RequestID), so sending it again is as safe as an idempotent one.
	keyed bool
}

// replayable reports whether the request can be sent again.
func (r *request) replayable() bool { return r.stream == nil && !r.noRetry }

func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// send sends r, retrying as configured (WithRetry), and returns a 2xx
// response whose body the caller must close. Any other status becomes an
// *Error.
func (c *Client) send(ctx context.Context, r *request) (*http.Response, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(nop)
		if r.timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, r.timeout)
		}
		server := c.cur.Load()
		req, err := c.newRequest(actx, c.bases[server], r)
		if err != nil {
			cancel()
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			// An attempt that ran out of time is not repeated: the server
			// is slow, and waiting again would double the wait.
			timedOut := actx.Err() != nil
			cancel()
			if attempt < c.retries && r.replayable() && (idempotent(r.method) || r.keyed || notSent(err)) && !timedOut && ctx.Err() == nil {
				c.failover(server)
				if c.pause(ctx, start, backoff(attempt, 0)) {
					continue
				}
			}
			return nil, err
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
			return resp, nil
		}
		e := readError(resp)
		cancel()
		if attempt < c.retries && r.replayable() && retryableStatus(r.method, r.keyed, e) && e.RetryAfter <= maxRetryAfter {
			if e.StatusCode == http.StatusServiceUnavailable {
				c.failover(server) // 429 is the token's, the same everywhere
			}
			if c.pause(ctx, start, backoff(attempt, e.RetryAfter)) {
				continue
			}
		}
		return nil, e
	}
}

// retryableStatus reports whether an error response says that the
// request did nothing and may succeed if sent again (see WithRetry).
func retryableStatus(method string, keyed bool, e *Error) bool {
	switch e.StatusCode {
	case http.StatusTooManyRequests:
		return e.Code != api.CodeTooManySandboxes
	case http.StatusServiceUnavailable:
		return e.RetryAfter > 0 || idempotent(method) || keyed
	}
	return false
}

// notSent reports whether a transport error happened before the request
// was sent (while dialing), so that sending it again cannot repeat it.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// cancelBody ends an attempt's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// pause waits d and reports true, or reports false at once if ctx, or
// the retry budget of a request sent at start, would end first.
func (c *Client) pause(ctx context.Context, start time.Time, d time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	if c.budget > 0 && time.Since(start)+d > c.budget {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff returns the wait before retry attempt+1: exponential (capped
// at backoffMax) or retryAfter if longer, plus up to a quarter more at
// random. The exponential part alone is jittered over its upper half.
func backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := backoffMax
	if attempt < 16 {
		d = min(backoffBase<<attempt, backoffMax)
	}
	if retryAfter <= 0 {
		return d/2 + rand.N(d/2+1)
	}
	d = max(d, retryAfter)
	return d + rand.N(d/4+1)
}

// readError consumes and closes the body of a non-2xx response.
func readError(resp *http.Response) *Error {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return newError(resp.StatusCode, resp.Header, body)
}

// readOnly hides a body's Close (and other methods) from net/http, which
// would otherwise close a caller's *os.File.
type readOnly struct{ io.Reader }

func (c *Client) newRequest(ctx context.Context, base string, r *request) (*http.Request, error) {
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, base+r.path, body)
	if err != nil {
		return nil, err
	}
	if r.stream != nil {
		switch {
		case r.size == 0:
			req.Body, req.ContentLength = http.NoBody, 0
		default:
			req.Body, req.ContentLength = io.NopCloser(readOnly{r.stream}), r.size
		}
	}
	h := req.Header
	if c.auth != nil {
		h["Authorization"] = c.auth
	}
	if c.agent != nil {
		h["User-Agent"] = c.agent
	}
	if r.accept != nil {
		h["Accept"] = r.accept
	}
	if r.ctype != nil {
		h["Content-Type"] = r.ctype
	}
	return req, nil
}

func nop() {}

// withTimeout bounds ctx by the client's timeout plus extra, unless ctx
// already ends sooner or the client has no timeout.
func (c *Client) withTimeout(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if c.timeout == 0 {
		return ctx, nop
	}
	d := c.timeout + extra
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, nop
	}
	return context.WithTimeout(ctx, d)
}

// call sends in (if not nil) as JSON and decodes a 2xx response into out
// (if not nil). extra extends the client's timeout of each attempt.
func (c *Client) call(ctx context.Context, method, path string, in, out any, extra time.Duration) error {
	r, err := jsonRequest(method, path, in)
	if err != nil {
		return err
	}
	r.timeout = c.attemptTimeout(extra)
	return c.exchange(ctx, r, out)
}

// attemptTimeout is the client's timeout plus extra, or 0 if the client
// has none.
func (c *Client) attemptTimeout(extra time.Duration) time.Duration {
	if c.timeout == 0 {
		return 0
	}
	return c.timeout + extra
}

// jsonRequest returns a request that sends in (if not nil) as JSON and
// accepts JSON.
func jsonRequest(method, path string, in any) (*request, error) {
	r := &request{method: method, path: path, accept: hdrJSON}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encoding request: %w", err)
		}
		r.body, r.ctype = b, hdrJSON
	}
	return r, nil
}

// exchange sends r, bounded by ctx only, and decodes a 2xx response into
// out (if not nil).
func (c *Client) exchange(ctx context.Context, r *request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	buf := c.bufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooledBuffer {
			c.bufs.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return fmt.Errorf("reading response: %w", err)
	}
	if err := json.Unmarshal(buf.Bytes(), out); err != nil {
		return fmt.Errorf("decoding %s response: %w", r.path, err)
	}
	return nil
}

var errEmptyID = errors.New("sandbox ID is empty")

// sandboxPath returns /v1/sandboxes/{id}{suffix}.
func sandboxPath(id, suffix string) (string, error) {
	if id == "" {
		return "", errEmptyID
	}
	return "/v1/sandboxes/" + url.PathEscape(id) + suffix, nil
}
