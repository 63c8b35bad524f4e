package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// CreateSandbox creates a sandbox and returns it once it runs.
// With req.RequestID set, the create is idempotent (see
// api.CreateSandboxRequest): the client then retries it, on another
// server too, after any failure it retries for a GET, a lost answer
// included.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (*api.Sandbox, error) {
	r, err := jsonRequest(http.MethodPost, "/v1/sandboxes", req)
	if err != nil {
		return nil, err
	}
	r.timeout, r.keyed = c.attemptTimeout(0), req.RequestID != ""
	var sb api.Sandbox
	if err := c.exchange(ctx, r, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// GetSandbox returns the sandbox id.
func (c *Client) GetSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodGet, p, nil, &sb, 0); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SandboxStats reports a running sandbox's resource use and the limits it
// hit (OOM kills, a full disk, refused forks).
func (c *Client) SandboxStats(ctx context.Context, id string) (*api.SandboxStats, error) {
	p, err := sandboxPath(id, "/stats")
	if err != nil {
		return nil, err
	}
	var st api.SandboxStats
	if err := c.call(ctx, http.MethodGet, p, nil, &st, 0); err != nil {
		return nil, err
	}
	return &st, nil
}

// DeleteSandbox destroys the sandbox id. Deleting a sandbox that is already
// gone is not an error for the server, but an unknown ID is ErrNotFound.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	p, err := sandboxPath(id, "")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, 0)
}

// Integrity returns the sandbox's integrity report: its phases, the audit
// rules it hit and the actions refused.
func (c *Client) Integrity(ctx context.Context, id string) (*api.IntegrityReport, error) {
	p, err := sandboxPath(id, "/integrity")
	if err != nil {
		return nil, err
	}
	var r api.IntegrityReport
	if err := c.call(ctx, http.MethodGet, p, nil, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// AuditEvents returns what the node's monitor saw in the sandbox, oldest
// first: up to limit events (0: the server's default) after skip.
func (c *Client) AuditEvents(ctx context.Context, id string, skip, limit int) ([]api.AuditEvent, error) {
	p, err := sandboxPath(id, "/events")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if skip > 0 {
		q.Set("skip", strconv.Itoa(skip))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var l api.AuditEventList
	if err := c.call(ctx, http.MethodGet, p, nil, &l, 0); err != nil {
		return nil, err
	}
	return l.Events, nil
}

// SetPhase moves the sandbox to another of its phases (back: allow an
// earlier one). Every process of the current phase ends first.
func (c *Client) SetPhase(ctx context.Context, id, phase string, back bool) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "/phase")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, p, api.SetPhaseRequest{Phase: phase, Back: back}, &sb, 0); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SetTimeout makes the sandbox expire timeout from now, rounded up to a
// whole second.
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "/timeout")
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		return nil, errors.New("timeout must be positive")
	}
	req := api.SetTimeoutRequest{TimeoutS: int(math.Ceil(timeout.Seconds()))}
	var sb api.Sandbox
	if err := c.call(ctx, http.MethodPost, p, req, &sb, 0); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters and pages ListSandboxes. The zero value lists the
// first page of all sandboxes.
type ListOptions struct {
	// Labels that every listed sandbox must carry.
	Labels map[string]string
	State  api.State
	Tier   string
	// Limit is the page size (server default 100, at most 1000).
	Limit     int
	PageToken string
}

// query encodes o as a query string, labels as repeated label=k=v in key
// order.
func (o ListOptions) query() string {
	q := url.Values{}
	keys := make([]string, 0, len(o.Labels))
	for k := range o.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		q.Add("label", k+"="+o.Labels[k])
	}
	if o.State != "" {
		q.Set("state", string(o.State))
	}
	if o.Tier != "" {
		q.Set("tier", o.Tier)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.PageToken != "" {
		q.Set("page_token", o.PageToken)
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// ListSandboxes returns one page of sandboxes, newest first.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) (*api.SandboxList, error) {
	var l api.SandboxList
	if err := c.call(ctx, http.MethodGet, "/v1/sandboxes"+opts.query(), nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// ListAllSandboxes follows the pages of ListSandboxes from opts.PageToken
// to the last one and returns every sandbox.
func (c *Client) ListAllSandboxes(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	var all []api.Sandbox
	seen := map[string]bool{}
	for {
		l, err := c.ListSandboxes(ctx, opts)
		if err != nil {
			return nil, err
		}
		all = append(all, l.Sandboxes...)
		if l.NextPageToken == "" {
			return all, nil
		}
		if seen[l.NextPageToken] {
			return nil, errors.New("listing sandboxes: server repeated a page token")
		}
		seen[l.NextPageToken] = true
		opts.PageToken = l.NextPageToken
	}
}

// Grade runs a sealed grading of the sandbox's work (POST …/grade): the
// call lasts as long as the grader, so the client's timeout is extended
// by the request's (default 300 s) plus two minutes for the sandbox.
func (c *Client) Grade(ctx context.Context, id string, req api.GradeRequest) (*api.GradeResult, error) {
	p, err := sandboxPath(id, "/grade")
	if err != nil {
		return nil, err
	}
	wait := req.TimeoutS
	if wait <= 0 {
		wait = 300
	}
	var res api.GradeResult
	if err := c.call(ctx, http.MethodPost, p, req, &res, time.Duration(wait*float64(time.Second))+2*time.Minute); err != nil {
		return nil, err
	}
	return &res, nil
}

// FollowAuditEvents streams the sandbox's audit events to fn (GET
// …/events/stream): those after skip, then each new one as the node's
// monitor sees it, until the sandbox has ended (nil), ctx ends (its
// error), or fn fails (its error). The client's timeout does not apply.
func (c *Client) FollowAuditEvents(ctx context.Context, id string, skip int, fn func(api.AuditEvent) error) error {
	p, err := sandboxPath(id, "/events/stream")
	if err != nil {
		return err
	}
	if skip > 0 {
		p += "?skip=" + strconv.Itoa(skip)
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p, accept: hdrNDJSON})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var e api.AuditEvent
		if err := dec.Decode(&e); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading audit events: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}
