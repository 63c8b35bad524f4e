package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/store"
)

// AgentPath is where an image holds the in-sandbox agent, which the
// container tier starts as each sandbox's first process (the
// toolkit/dsec-guest layer puts it there). The VM tiers bring their own,
// in the initramfs.
const AgentPath = "/opt/dsec/bin/dsec-guest"

// AgentLayer names the layer that holds the agent.
const AgentLayer = "toolkit/dsec-guest:latest"

// maxMetaBytes bounds a metadata image read to look for the agent.
const maxMetaBytes = 256 << 20

// needsAgent reports whether an image meant for tiers (none: any) may
// be run by the container tier.
func needsAgent(tiers []string) bool {
	return len(tiers) == 0 || slices.Contains(tiers, api.TierContainer)
}

// ensureAgent returns the image's layers with the agent: as they are if
// one of them holds it (or the image is not for the container tier),
// else with the server's agent layer (AgentLayer) added on top as a
// toolkit, which is how the built-in images are made. Without that layer
// the image is refused (Invalid, image_lacks_guest): it would be
// accepted here and fail at every create.
func (r *Registry) ensureAgent(ctx context.Context, layers []api.ImageLayer, recs []store.LayerRecord, tiers []string) ([]api.ImageLayer, []store.LayerRecord, error) {
	if !needsAgent(tiers) {
		return layers, recs, nil
	}
	for i := len(recs) - 1; i >= 0; i-- {
		ok, err := r.hasAgent(ctx, recs[i])
		if err != nil {
			return nil, nil, err
		}
		if ok {
			return layers, recs, nil
		}
	}
	agent, err := r.ResolveLayer(ctx, AgentLayer)
	if err == nil {
		var ok bool
		if ok, err = r.hasAgent(ctx, agent); err == nil && !ok {
			err = fmt.Errorf("layer %s has no %s", AgentLayer, AgentPath)
		}
	}
	if err != nil {
		return nil, nil, errdefs.Within(errdefs.Invalid, api.CodeImageLacksGuest, err,
			"the image may run on the container tier, which needs the agent at %s, none of its layers has it, and the server's %s cannot be added; add a layer with the agent, or name the tiers the image is for (microvm, vm, function)",
			AgentPath, AgentLayer)
	}
	return append(slices.Clone(layers), api.ImageLayer{Role: RoleToolkit, ID: agent.ID}), append(slices.Clone(recs), agent), nil
}

// hasAgent reports whether the layer holds the agent as a regular file,
// reading only its metadata image; the answer is kept (layers never
// change).
func (r *Registry) hasAgent(ctx context.Context, rec store.LayerRecord) (bool, error) {
	r.mu.Lock()
	ok, known := r.agentIn[rec.ID]
	r.mu.Unlock()
	if known {
		return ok, nil
	}
	if r.blobs == nil {
		return false, errdefs.New(errdefs.Unsupported, api.CodeNoBlobStore, "this server has no layer store")
	}
	if rec.Manifest.Meta.Size > maxMetaBytes {
		return false, errdefs.New(errdefs.TooLarge, api.CodeLayerMetaTooLarge, "layer %s has a %d-byte metadata image, more than %d", rec.ID, rec.Manifest.Meta.Size, maxMetaBytes)
	}
	rc, _, err := r.blobs.Open(ctx, rec.Manifest.Meta.Digest)
	if err != nil {
		return false, fmt.Errorf("reading layer %s's metadata: %w", rec.ID, err)
	}
	meta, err := io.ReadAll(io.LimitReader(rc, maxMetaBytes))
	rc.Close()
	if err != nil {
		return false, fmt.Errorf("reading layer %s's metadata: %w", rec.ID, err)
	}
	fi, err := layer.StatMeta(bytes.NewReader(meta), AgentPath)
	switch {
	case err == nil:
		ok = fi.Mode().IsRegular()
	case errors.Is(err, fs.ErrNotExist):
		ok = false
	default:
		return false, err
	}
	r.mu.Lock()
	r.agentIn[rec.ID] = ok
	r.mu.Unlock()
	return ok, nil
}

// layerNames lists an image's layers by a name of each, or ID.
func layerNames(img Resolved) string {
	var out []string
	for _, l := range img.Manifest.Layers {
		out = append(out, l.Role+"="+shortID(l.ID))
	}
	return strings.Join(out, ", ")
}

func shortID(id string) string {
	if len(id) > len("sha256:")+12 {
		return id[len("sha256:") : len("sha256:")+12]
	}
	return id
}
