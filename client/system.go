package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// Health reports whether the server is ready. A server that is up but not
// ready answers with an *Error of class unavailable, at once: the probe
// is not retried.
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	var h api.Health
	r := &request{method: http.MethodGet, path: "/v1/health", accept: hdrJSON, timeout: c.attemptTimeout(0), noRetry: true}
	if err := c.exchange(ctx, r, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Version returns the server's version.
func (c *Client) Version(ctx context.Context) (*api.VersionInfo, error) {
	var v api.VersionInfo
	if err := c.call(ctx, http.MethodGet, "/v1/version", nil, &v, 0); err != nil {
		return nil, err
	}
	return &v, nil
}

// Nodes lists the nodes, the tiers they run and their capacity.
func (c *Client) Nodes(ctx context.Context) (*api.NodeList, error) {
	var l api.NodeList
	if err := c.call(ctx, http.MethodGet, "/v1/nodes", nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// OpenAPI returns the server's OpenAPI document, as JSON.
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	return c.getRaw(ctx, "/v1/openapi.json", hdrJSON)
}

// Metrics returns the server's Prometheus metrics, in the text format.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	return c.getRaw(ctx, "/metrics", nil)
}

func (c *Client) getRaw(ctx context.Context, path string, accept []string) ([]byte, error) {
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: path, accept: accept, timeout: c.attemptTimeout(0)})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// CordonNode stops placing sandboxes on node; UncordonNode places them
// there again (and ends a drain).
func (c *Client) CordonNode(ctx context.Context, node string) (*api.Node, error) {
	return c.nodeAction(ctx, node, "cordon", nil)
}

func (c *Client) UncordonNode(ctx context.Context, node string) (*api.Node, error) {
	return c.nodeAction(ctx, node, "uncordon", nil)
}

// DrainNode cordons node and moves its sandboxes off: those recorded with
// resume_on_preempt are resumed elsewhere; the others run until they end
// or req's deadline.
func (c *Client) DrainNode(ctx context.Context, node string, req api.DrainRequest) (*api.Node, error) {
	return c.nodeAction(ctx, node, "drain", req)
}

func (c *Client) nodeAction(ctx context.Context, node, action string, in any) (*api.Node, error) {
	if node == "" || strings.ContainsAny(node, "/?#") {
		return nil, fmt.Errorf("node ID %q is not valid", node)
	}
	var n api.Node
	if err := c.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/"+action, in, &n, 0); err != nil {
		return nil, err
	}
	return &n, nil
}
