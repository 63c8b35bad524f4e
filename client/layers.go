package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// Layer source kinds, for ImportLayer.
const (
	// KindTar is a tar stream of a file tree, optionally gzip-compressed.
	KindTar = "tar"
	// KindOCI is an OCI image layout as a tar, or a `docker save`
	// archive; the server flattens its layers into one.
	KindOCI = "oci"
)

// hdrTar is the Content-Type of layer uploads.
var hdrTar = []string{"application/x-tar"}

// refPath returns prefix + "/" + ref with each '/'-separated segment of
// ref escaped and the separators kept, as the API's {ref...} paths take
// it: "base/busybox:1.36" stays readable, "a b" becomes "a%20b". what
// names the reference in errors.
func refPath(prefix, what, ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("%s reference is empty", what)
	}
	segs := strings.Split(ref, "/")
	for i, s := range segs {
		if s == "" || s == "." || s == ".." {
			return "", fmt.Errorf("%s reference %q: empty, \".\" or \"..\" path segment", what, ref)
		}
		segs[i] = url.PathEscape(s)
	}
	return prefix + "/" + strings.Join(segs, "/"), nil
}

// ListLayers lists the layers the server holds.
func (c *Client) ListLayers(ctx context.Context) (*api.LayerList, error) {
	var l api.LayerList
	if err := c.call(ctx, http.MethodGet, "/v1/layers", nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetLayer describes the layer ref: a name:version (names may contain
// '/') or a layer ID. An unknown ref is ErrNotFound.
func (c *Client) GetLayer(ctx context.Context, ref string) (*api.Layer, error) {
	p, err := refPath("/v1/layers", "layer", ref)
	if err != nil {
		return nil, err
	}
	var l api.Layer
	if err := c.call(ctx, http.MethodGet, p, nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// ImportLayer builds a layer from the archive r and, if name is not
// empty, names it (name:version). kind is KindTar (a tar stream, gzip
// allowed; "" means the same) or KindOCI (an OCI image layout as a tar,
// or a `docker save` archive). r is streamed, not buffered, with a
// Content-Length when its size is known (see WriteFile); an *os.File is
// not closed. The upload is never retried and only ctx bounds it, so that
// the client's timeout does not cut a large upload or the build that
// follows it. The server answers ErrTooLarge for an archive over its
// limit and ErrInvalid for one it cannot read.
func (c *Client) ImportLayer(ctx context.Context, kind string, r io.Reader, name string) (*api.Layer, error) {
	if kind != "" && kind != KindTar && kind != KindOCI {
		return nil, fmt.Errorf("layer kind %q: want %q or %q", kind, KindTar, KindOCI)
	}
	if r == nil {
		return nil, errors.New("layer archive is nil")
	}
	q := url.Values{}
	if kind != "" {
		q.Set("kind", kind)
	}
	if name != "" {
		q.Set("name", name)
	}
	p := "/v1/layers"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var l api.Layer
	err := c.exchange(ctx, &request{
		method: http.MethodPost, path: p,
		stream: r, size: bodySize(r),
		accept: hdrJSON, ctype: hdrTar,
	}, &l)
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// BuildDirLayer makes the server build a layer from the directory path on
// its own host (the path as the server sees it) and, if name is not
// empty, name it. The server may refuse it (ErrPermissionDenied) unless
// its operator allows directory layers. Only ctx bounds the build.
func (c *Client) BuildDirLayer(ctx context.Context, path, name string) (*api.Layer, error) {
	if path == "" {
		return nil, errors.New("layer directory path is empty")
	}
	r, err := jsonRequest(http.MethodPost, "/v1/layers/dir", api.BuildDirLayerRequest{Path: path, Name: name})
	if err != nil {
		return nil, err
	}
	var l api.Layer
	if err := c.exchange(ctx, r, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// DeleteLayer removes a layer name (given name:version) or, given a layer
// ID, the layer, its names and its blobs. A layer that an image or a live
// sandbox uses is ErrConflict.
func (c *Client) DeleteLayer(ctx context.Context, ref string) error {
	p, err := refPath("/v1/layers", "layer", ref)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, 0)
}
