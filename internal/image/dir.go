package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// AddDir registers dir (absolute) on the server as image name: a
// development convenience, served read-only as it is, without layers.
func (r *Registry) AddDir(ctx context.Context, name, dir string, tiers []string) (Resolved, error) {
	n, err := Normalize(name)
	if err != nil {
		return Resolved{}, err
	}
	if !filepath.IsAbs(dir) {
		return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeInvalidPath, "image directory %q must be absolute", dir)
	}
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return Resolved{}, errdefs.New(errdefs.NotFound, api.CodeDirectoryNotFound, "directory %s does not exist on the server", dir)
	}
	if err != nil || !fi.IsDir() {
		return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeNotADirectory, "%s is not a directory", dir)
	}
	for _, t := range tiers {
		if !slices.Contains(api.Tiers, t) {
			return Resolved{}, errdefs.New(errdefs.Invalid, api.CodeUnknownTier, "unknown tier %q", t)
		}
	}
	m := store.ImageManifest{Version: 1, Source: "dir:" + dir, Tiers: tiers}
	rec := store.ImageRecord{ID: m.ID(), Manifest: m, Created: time.Now().UTC()}
	if err := r.recs.PutImage(ctx, rec); err != nil {
		return Resolved{}, err
	}
	if err := r.recs.SetImageName(ctx, n, rec.ID); err != nil {
		return Resolved{}, err
	}
	r.forgetName(n)
	return Resolved{ID: rec.ID, Name: n, Manifest: m}, nil
}
