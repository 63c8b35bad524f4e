// Package image names and resolves the images sandboxes start from. Today
// an image is a host directory the operator registers (`dsec image
// add-dir`); the layer store of EROFS layers will implement the same
// resolution, so callers only ever see Resolve and a source string.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// DefaultTag is the tag of a name given without one.
const DefaultTag = "latest"

// records is the subset of the store images live in.
type records interface {
	PutImage(ctx context.Context, r store.ImageRecord) error
	GetImage(ctx context.Context, name string) (store.ImageRecord, error)
	ListImages(ctx context.Context) ([]store.ImageRecord, error)
}

// cacheTTL is how long a resolved name is reused without asking the
// store. Every create resolves its image; under a burst of creates the
// store's latency would otherwise add to each one. A re-tag is seen by
// other servers within this time.
const cacheTTL = 5 * time.Second

// Registry resolves image references. It is safe for concurrent use.
type Registry struct {
	recs records

	mu    sync.Mutex // guards following fields
	cache map[string]cachedImage
}

type cachedImage struct {
	rec     store.ImageRecord
	expires time.Time
}

// New returns a registry over recs.
func New(recs records) *Registry { return &Registry{recs: recs, cache: map[string]cachedImage{}} }

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,127}(:[A-Za-z0-9._-]{1,64})?$`)

// Normalize validates a reference and adds the default tag.
func Normalize(ref string) (string, error) {
	if !namePattern.MatchString(ref) || strings.Contains(ref, "..") || strings.HasSuffix(strings.SplitN(ref, ":", 2)[0], "/") {
		return "", errdefs.New(errdefs.Invalid, "invalid_image_name", "image name %q is not valid (lower-case name[/path][:tag])", ref)
	}
	if !strings.Contains(ref, ":") {
		ref += ":" + DefaultTag
	}
	return ref, nil
}

// Resolve returns the image a reference names: name[:tag] or an image ID
// ("sha256:…").
func (r *Registry) Resolve(ctx context.Context, ref string) (store.ImageRecord, error) {
	if strings.HasPrefix(ref, "sha256:") {
		all, err := r.recs.ListImages(ctx)
		if err != nil {
			return store.ImageRecord{}, err
		}
		for _, img := range all {
			if img.ID == ref {
				return img, nil
			}
		}
		return store.ImageRecord{}, errdefs.New(errdefs.NotFound, "image_not_found", "image %q not found", ref)
	}
	name, err := Normalize(ref)
	if err != nil {
		return store.ImageRecord{}, err
	}
	now := time.Now()
	r.mu.Lock()
	c, ok := r.cache[name]
	r.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.rec, nil
	}
	rec, err := r.recs.GetImage(ctx, name)
	if err != nil {
		return rec, err
	}
	r.mu.Lock()
	r.cache[name] = cachedImage{rec: rec, expires: now.Add(cacheTTL)}
	r.mu.Unlock()
	return rec, nil
}

// AddDir registers dir (made absolute) as image name, replacing a
// previous image of that name. The directory must exist.
func (r *Registry) AddDir(ctx context.Context, name, dir string, tiers []string) (store.ImageRecord, error) {
	name, err := Normalize(name)
	if err != nil {
		return store.ImageRecord{}, err
	}
	if !filepath.IsAbs(dir) {
		return store.ImageRecord{}, errdefs.New(errdefs.Invalid, "invalid_path", "image directory %q must be absolute", dir)
	}
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return store.ImageRecord{}, errdefs.New(errdefs.NotFound, "directory_not_found", "directory %s does not exist on the server", dir)
	}
	if err != nil || !fi.IsDir() {
		return store.ImageRecord{}, errdefs.New(errdefs.Invalid, "not_a_directory", "%s is not a directory", dir)
	}
	for _, t := range tiers {
		if !slices.Contains(api.Tiers, t) {
			return store.ImageRecord{}, errdefs.New(errdefs.Invalid, "unknown_tier", "unknown tier %q", t)
		}
	}
	rec := store.ImageRecord{Name: name, Source: "dir:" + dir, Tiers: tiers, Created: time.Now().UTC().Format(time.RFC3339Nano)}
	manifest, _ := json.Marshal(rec)
	sum := sha256.Sum256(manifest)
	rec.ID = "sha256:" + hex.EncodeToString(sum[:])
	if err := r.recs.PutImage(ctx, rec); err != nil {
		return store.ImageRecord{}, err
	}
	r.mu.Lock()
	delete(r.cache, name)
	r.mu.Unlock()
	return rec, nil
}

// List returns every image, sorted by name.
func (r *Registry) List(ctx context.Context) ([]api.Image, error) {
	recs, err := r.recs.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, 0, len(recs))
	for _, rec := range recs {
		out = append(out, ToAPI(rec))
	}
	slices.SortFunc(out, func(a, b api.Image) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ToAPI converts a record to its wire form.
func ToAPI(rec store.ImageRecord) api.Image {
	created, _ := time.Parse(time.RFC3339Nano, rec.Created)
	return api.Image{ID: rec.ID, Name: rec.Name, Tiers: rec.Tiers, Source: rec.Source, CreatedAt: created}
}

// Supports reports whether the image is meant for tier.
func Supports(rec store.ImageRecord, tier string) bool {
	return len(rec.Tiers) == 0 || slices.Contains(rec.Tiers, tier)
}
