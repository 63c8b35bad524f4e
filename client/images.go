package client

import (
	"context"
	"errors"
	"net/http"

	"github.com/dsec-dev/dsec/api"
)

// Images lists the images sandboxes can start from, one entry per name
// (and one per unnamed image).
func (c *Client) Images(ctx context.Context) (*api.ImageList, error) {
	var l api.ImageList
	if err := c.call(ctx, http.MethodGet, "/v1/images", nil, &l, 0); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetImage resolves the image ref: a name[:tag] (names may contain '/')
// or an image ID. An unknown ref is ErrNotFound.
func (c *Client) GetImage(ctx context.Context, ref string) (*api.Image, error) {
	p, err := refPath("/v1/images", "image", ref)
	if err != nil {
		return nil, err
	}
	var img api.Image
	if err := c.call(ctx, http.MethodGet, p, nil, &img, 0); err != nil {
		return nil, err
	}
	return &img, nil
}

// CreateImage composes an image from layers and names it req.Name
// (name:tag). Give the layers as req.Layers (bottom first) or with the
// Base, Workspace and Toolkit shorthand, not both. An unknown layer is
// ErrNotFound.
func (c *Client) CreateImage(ctx context.Context, req api.CreateImageRequest) (*api.Image, error) {
	if req.Name == "" {
		return nil, errors.New("image name is empty")
	}
	var img api.Image
	if err := c.call(ctx, http.MethodPost, "/v1/images", req, &img, 0); err != nil {
		return nil, err
	}
	return &img, nil
}

// TagImage points the name:tag name at the image ref (a name[:tag] or an
// ID) and returns the image. Tags move; image IDs do not.
func (c *Client) TagImage(ctx context.Context, ref, name string) (*api.Image, error) {
	if ref == "" || name == "" {
		return nil, errors.New("image reference and name must not be empty")
	}
	var img api.Image
	if err := c.call(ctx, http.MethodPost, "/v1/images/tag", api.TagRequest{Image: ref, Name: name}, &img, 0); err != nil {
		return nil, err
	}
	return &img, nil
}

// DeleteImage removes an image name (given name[:tag]) or, given an image
// ID, the image and all its names. An image that a live sandbox uses is
// ErrConflict.
func (c *Client) DeleteImage(ctx context.Context, ref string) error {
	p, err := refPath("/v1/images", "image", ref)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, 0)
}

// AddDirImage registers a directory on the server host as an image. The
// path is taken as the server sees it.
func (c *Client) AddDirImage(ctx context.Context, req api.AddDirImageRequest) (*api.Image, error) {
	var img api.Image
	if err := c.call(ctx, http.MethodPost, "/v1/images/dir", req, &img, 0); err != nil {
		return nil, err
	}
	return &img, nil
}
