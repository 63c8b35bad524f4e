package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// ImageRecord is the durable record of an image.
type ImageRecord struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Source says where the image comes from, e.g. "dir:/abs/path".
	Source string   `json:"source"`
	Tiers  []string `json:"tiers,omitempty"`
	// Created is RFC 3339.
	Created string `json:"created"`
}

// imageKey maps an image name to a KV key (names may hold ':' and other
// characters keys cannot).
func imageKey(name string) string {
	h := sha256.Sum256([]byte(name))
	return "n_" + hex.EncodeToString(h[:16])
}

// PutImage stores an image record under its name, replacing any previous
// one (names are movable; IDs are not).
func (s *Store) PutImage(ctx context.Context, r ImageRecord) error {
	_, err := put(ctx, s.images, imageKey(r.Name), "image", r)
	return err
}

// GetImage returns the image named name; NotFound if absent.
func (s *Store) GetImage(ctx context.Context, name string) (ImageRecord, error) {
	r, _, err := get[ImageRecord](ctx, s.images, imageKey(name), "image")
	if errors.Is(err, errdefs.NotFound) {
		return r, errdefs.New(errdefs.NotFound, "image_not_found", "image %q not found", name)
	}
	return r, err
}

// ListImages returns every image.
func (s *Store) ListImages(ctx context.Context) ([]ImageRecord, error) {
	return list[ImageRecord](ctx, s.images, "image")
}
