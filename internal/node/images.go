package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// layerViews is the part of the layer cache the service uses: read-only
// views of layer stacks, refcounted, and their garbage collection.
type layerViews interface {
	View(ctx context.Context, layers []layercache.Layer) (string, func(), error)
	GC(ctx context.Context) error
}

// resolveImage materialises an image on this node and returns it with a
// release function. Layered images are read-only views from the layer
// cache; development images are host directories ("dir:/abs/path").
func (a *Service) resolveImage(ctx context.Context, ownRoot bool, ref noderpc.ImageRef) (sandbox.Image, func(), error) {
	if len(ref.Layers) > 0 && ownRoot {
		// The tier mounts its own roots from the layers (and re-adopts
		// them itself after a restart).
		return sandbox.Image{ID: ref.ID, Name: ref.Name, Layers: ref.Layers}, func() {}, nil
	}
	if len(ref.Layers) > 0 {
		if a.opt.Layers == nil {
			return sandbox.Image{}, nil, errdefs.New(errdefs.Unsupported, api.CodeNoLayerCache, "node %s has no layer cache", a.opt.ID)
		}
		dir, release, err := a.opt.Layers.View(ctx, cacheLayers(ref))
		if err != nil {
			return sandbox.Image{}, nil, err
		}
		return sandbox.Image{ID: ref.ID, Name: ref.Name, Root: dir}, release, nil
	}
	dir, ok := strings.CutPrefix(ref.Source, "dir:")
	if !ok {
		return sandbox.Image{}, nil, errdefs.New(errdefs.Unsupported, api.CodeImageSourceUnsupported, "image %s has source %q, which this node cannot load", ref.Name, ref.Source)
	}
	if !filepath.IsAbs(dir) {
		return sandbox.Image{}, nil, errdefs.New(errdefs.Invalid, api.CodeInvalidImage, "image %s: directory %q is not absolute", ref.Name, dir)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return sandbox.Image{}, nil, errdefs.New(errdefs.NotFound, api.CodeImageMissingOnNode, "image %s: directory %s is missing on this node", ref.Name, dir)
	}
	return sandbox.Image{ID: ref.ID, Name: ref.Name, Root: dir}, func() {}, nil
}

// layerWarmer is the part of the layer cache that fetches and mounts a
// stack ahead of its use.
type layerWarmer interface {
	Warm(ctx context.Context, layers []layercache.Layer) error
}

// maxWarming bounds the warms that run at once; a create arriving past
// it fetches its layers itself, when its turn comes.
const maxWarming = 8

// warm starts fetching a create's layers as it arrives, before it waits
// at the admission gate: a burst of creates queued for their turn then
// finds its layers (or, loaded lazily, their access profiles' chunks)
// local. It runs in the background, within the node's life.
func (a *Service) warm(ref noderpc.ImageRef) {
	w, ok := a.opt.Layers.(layerWarmer)
	if !ok || len(ref.Layers) == 0 || a.bg == nil {
		return
	}
	select {
	case a.warming <- struct{}{}:
	default:
		return
	}
	layers := cacheLayers(ref)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() { <-a.warming }()
		// A failure is the create's to report, when it needs the layers.
		if err := w.Warm(a.bg, layers); err != nil && a.bg.Err() == nil {
			a.log.Debug("fetching a create's layers ahead of its start", "image", ref.ID, "err", err)
		}
	}()
}

// cacheLayers are an image's layers as the layer cache takes them.
func cacheLayers(ref noderpc.ImageRef) []layercache.Layer {
	layers := make([]layercache.Layer, len(ref.Layers))
	for i, l := range ref.Layers {
		layers[i] = layercache.Layer{ID: l.ID, Manifest: l.Manifest}
	}
	return layers
}
