package store

import (
	"context"
	"time"

	"github.com/dsec-dev/dsec/internal/image/layer"
)

// ImageManifest defines an image: its layers (bottom first) or, for a
// development directory image, its source directory.
type ImageManifest struct {
	Version int          `json:"version"`
	Layers  []ImageLayer `json:"layers,omitempty"`
	// Source is "dir:/abs/path" for directory images.
	Source string   `json:"source,omitempty"`
	Tiers  []string `json:"tiers,omitempty"`
}

// ImageLayer is one layer of an image and its role.
type ImageLayer struct {
	Role string `json:"role"` // base, workspace, toolkit, or another name
	ID   string `json:"id"`
}

// ID is the image's ID: the SHA-256 of its canonical manifest.
func (m ImageManifest) ID() string {
	b, _ := jsonCanonical(m)
	return layer.Digest(b)
}

// ImageRecord is a stored image.
type ImageRecord struct {
	ID       string        `json:"id"`
	Manifest ImageManifest `json:"manifest"`
	Created  time.Time     `json:"created"`
}

// LayerRecord is a stored layer: its manifest (which names its files in
// the blob store) and where it came from.
type LayerRecord struct {
	ID       string         `json:"id"`
	Manifest layer.Manifest `json:"manifest"`
	Created  time.Time      `json:"created"`
}

func (s *Store) images() catalog[ImageRecord] {
	return catalog[ImageRecord]{kv: s.imageKV, what: "image"}
}
func (s *Store) layers() catalog[LayerRecord] {
	return catalog[LayerRecord]{kv: s.layerKV, what: "layer"}
}

// PutImage stores an image record (idempotent: records are immutable).
func (s *Store) PutImage(ctx context.Context, r ImageRecord) error {
	return s.images().put(ctx, r.ID, r)
}

// GetImage returns the image with the given ID.
func (s *Store) GetImage(ctx context.Context, id string) (ImageRecord, error) {
	return s.images().get(ctx, id)
}

// DeleteImage removes an image record.
func (s *Store) DeleteImage(ctx context.Context, id string) error { return s.images().delete(ctx, id) }

// SetImageName points name (name:tag) at an image ID, moving it if it
// pointed elsewhere.
func (s *Store) SetImageName(ctx context.Context, name, id string) error {
	return s.images().setName(ctx, NameRecord{Name: name, ID: id, Updated: time.Now().UTC().Format(time.RFC3339Nano)})
}

// GetImageName returns what name points at.
func (s *Store) GetImageName(ctx context.Context, name string) (NameRecord, error) {
	return s.images().getName(ctx, name)
}

// DeleteImageName removes a name.
func (s *Store) DeleteImageName(ctx context.Context, name string) error {
	return s.images().deleteName(ctx, name)
}

// ListImages returns every image and every image name.
func (s *Store) ListImages(ctx context.Context) ([]ImageRecord, []NameRecord, error) {
	return s.images().list(ctx)
}

// PutLayer stores a layer record (idempotent).
func (s *Store) PutLayer(ctx context.Context, r LayerRecord) error {
	return s.layers().put(ctx, r.ID, r)
}

// GetLayer returns the layer with the given ID.
func (s *Store) GetLayer(ctx context.Context, id string) (LayerRecord, error) {
	return s.layers().get(ctx, id)
}

// DeleteLayer removes a layer record.
func (s *Store) DeleteLayer(ctx context.Context, id string) error { return s.layers().delete(ctx, id) }

// SetLayerName points name (name:version) at a layer ID.
func (s *Store) SetLayerName(ctx context.Context, name, id string) error {
	return s.layers().setName(ctx, NameRecord{Name: name, ID: id, Updated: time.Now().UTC().Format(time.RFC3339Nano)})
}

// GetLayerName returns what name points at.
func (s *Store) GetLayerName(ctx context.Context, name string) (NameRecord, error) {
	return s.layers().getName(ctx, name)
}

// DeleteLayerName removes a layer name.
func (s *Store) DeleteLayerName(ctx context.Context, name string) error {
	return s.layers().deleteName(ctx, name)
}

// ListLayers returns every layer and every layer name.
func (s *Store) ListLayers(ctx context.Context) ([]LayerRecord, []NameRecord, error) {
	return s.layers().list(ctx)
}
