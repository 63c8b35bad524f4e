package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/store"
)

// ResolveLayer returns the layer a reference names: name[:version] or ID.
func (r *Registry) ResolveLayer(ctx context.Context, ref string) (store.LayerRecord, error) {
	if layer.ValidDigest(ref) {
		return r.layer(ctx, ref)
	}
	n, err := Normalize(ref)
	if err != nil {
		return store.LayerRecord{}, err
	}
	nr, err := r.recs.GetLayerName(ctx, n)
	if err != nil {
		return store.LayerRecord{}, err
	}
	return r.layer(ctx, nr.ID)
}

func (r *Registry) layer(ctx context.Context, id string) (store.LayerRecord, error) {
	r.mu.Lock()
	rec, ok := r.layers[id]
	r.mu.Unlock()
	if ok {
		return rec, nil
	}
	rec, err := r.recs.GetLayer(ctx, id)
	if err != nil {
		return rec, err
	}
	r.mu.Lock()
	r.layers[id] = rec
	r.mu.Unlock()
	return rec, nil
}

// AddLayer stores a built artifact's files in the blob store and records
// the layer, under names if given (name:version; each also moves
// name:latest). Adding a layer that exists only adds the names.
func (r *Registry) AddLayer(ctx context.Context, a layer.Artifact, names ...string) (store.LayerRecord, error) {
	if r.blobs == nil {
		return store.LayerRecord{}, errdefs.New(errdefs.Unsupported, api.CodeNoBlobStore, "this server has no blob store")
	}
	for i, n := range names {
		nn, err := Normalize(n)
		if err != nil {
			return store.LayerRecord{}, err
		}
		names[i] = nn
	}
	m := a.Manifest
	if err := m.Validate(); err != nil {
		return store.LayerRecord{}, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidLayer, err, "the built layer is not valid")
	}
	for _, f := range m.Files() {
		if _, err := r.blobs.Stat(ctx, f.Ref.Digest); err == nil {
			continue // stored before (a rebuild, or a file two layers share)
		}
		fh, err := os.Open(filepath.Join(a.Dir, f.Name))
		if err != nil {
			return store.LayerRecord{}, fmt.Errorf("reading layer file: %w", err)
		}
		_, err = r.blobs.Put(ctx, f.Ref.Digest, fh)
		fh.Close()
		if err != nil {
			return store.LayerRecord{}, err
		}
	}
	rec := store.LayerRecord{ID: m.ID(), Manifest: m, Created: time.Now().UTC()}
	if err := r.recs.PutLayer(ctx, rec); err != nil {
		return store.LayerRecord{}, err
	}
	for _, n := range names {
		if err := r.recs.SetLayerName(ctx, n, rec.ID); err != nil {
			return store.LayerRecord{}, err
		}
		if latest := strings.SplitN(n, ":", 2)[0] + ":" + DefaultTag; latest != n {
			if err := r.recs.SetLayerName(ctx, latest, rec.ID); err != nil {
				return store.LayerRecord{}, err
			}
		}
	}
	return r.layer(ctx, rec.ID)
}

// Import kinds.
const (
	KindTar = "tar" // a tar stream (optionally gzip), e.g. a directory the CLI packed
	KindOCI = "oci" // an OCI image layout (as a tar archive) or a `docker save` archive
)

// Import builds a layer from an uploaded archive and adds it.
func (r *Registry) Import(ctx context.Context, kind string, body io.Reader, name string) (store.LayerRecord, error) {
	work, cleanup, err := r.scratch()
	if err != nil {
		return store.LayerRecord{}, err
	}
	defer cleanup()
	out := filepath.Join(work, "layer")
	var a layer.Artifact
	switch kind {
	case KindTar, "":
		a, err = layer.BuildTar(ctx, body, out, r.buildOptions(work))
	case KindOCI:
		// The OCI readers need random access: spool the upload first.
		spool := filepath.Join(work, "upload.tar")
		if err = spoolTo(ctx, body, spool, r.limits.MaxBytes); err == nil {
			a, err = layer.BuildOCI(ctx, spool, out, r.buildOptions(work))
		}
	default:
		return store.LayerRecord{}, errdefs.New(errdefs.Invalid, api.CodeInvalidKind, "kind must be tar or oci, not %q", kind)
	}
	if err != nil {
		return store.LayerRecord{}, err
	}
	return r.AddLayer(ctx, a, names(name)...)
}

// BuildDir builds a layer from a directory on the server (operators; the
// CLI's --local) with mkfs.erofs and adds it.
func (r *Registry) BuildDir(ctx context.Context, dir, name string) (store.LayerRecord, error) {
	if !filepath.IsAbs(dir) {
		return store.LayerRecord{}, errdefs.New(errdefs.Invalid, api.CodeInvalidPath, "directory %q must be absolute", dir)
	}
	work, cleanup, err := r.scratch()
	if err != nil {
		return store.LayerRecord{}, err
	}
	defer cleanup()
	a, err := layer.BuildDir(ctx, filepath.Clean(dir), filepath.Join(work, "layer"), r.buildOptions(work))
	if err != nil {
		return store.LayerRecord{}, err
	}
	return r.AddLayer(ctx, a, names(name)...)
}

func names(name string) []string {
	if name == "" {
		return nil
	}
	return []string{name}
}

func (r *Registry) buildOptions(work string) layer.BuildOptions {
	o := r.limits
	o.TempDir = work
	return o
}

// scratch makes a private work directory for one build.
func (r *Registry) scratch() (string, func(), error) {
	if err := os.MkdirAll(r.workDir, 0o700); err != nil {
		return "", nil, fmt.Errorf("creating build directory: %w", err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	dir := filepath.Join(r.workDir, "build-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("creating build directory: %w", err)
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

func spoolTo(ctx context.Context, r io.Reader, path string, max int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	src := r
	if max > 0 {
		src = io.LimitReader(r, max+1)
	}
	n, err := io.Copy(f, src)
	if err != nil {
		return fmt.Errorf("receiving archive: %w", err)
	}
	if max > 0 && n > max {
		return errdefs.New(errdefs.TooLarge, api.CodeArchiveTooLarge, "the archive is larger than %d bytes", max)
	}
	return ctx.Err()
}

// ListLayers returns every layer with its names, sorted by first name.
func (r *Registry) ListLayers(ctx context.Context) ([]api.Layer, error) {
	recs, nrs, err := r.recs.ListLayers(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string][]string{}
	for _, n := range nrs {
		byID[n.ID] = append(byID[n.ID], n.Name)
	}
	out := make([]api.Layer, 0, len(recs))
	for _, rec := range recs {
		out = append(out, LayerToAPI(rec, byID[rec.ID]))
	}
	slices.SortFunc(out, func(a, b api.Layer) int {
		an, bn := "", ""
		if len(a.Names) > 0 {
			an = a.Names[0]
		}
		if len(b.Names) > 0 {
			bn = b.Names[0]
		}
		if c := strings.Compare(an, bn); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// LayerNames returns the names pointing at layer id.
func (r *Registry) LayerNames(ctx context.Context, id string) ([]string, error) {
	_, nrs, err := r.recs.ListLayers(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nrs {
		if n.ID == id {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// LayerToAPI converts a record to its wire form.
func LayerToAPI(rec store.LayerRecord, names []string) api.Layer {
	slices.Sort(names)
	m := rec.Manifest
	return api.Layer{ID: rec.ID, Names: names, MetaSize: m.Meta.Size, BlobSize: m.Blob.Size,
		SourceKind: m.Source.Kind, Source: m.Source.Digest, Builder: m.Builder.Name + " " + m.Builder.Version, CreatedAt: rec.Created}
}

// RemoveLayer deletes a layer and its blobs (given an ID), or one of its
// names. A layer an image uses cannot be deleted (Conflict); whether a
// sandbox uses it is checked by inUse, supplied by the control plane.
func (r *Registry) RemoveLayer(ctx context.Context, ref string, inUse func(layerID string) bool) error {
	if !layer.ValidDigest(ref) {
		n, err := Normalize(ref)
		if err != nil {
			return err
		}
		if _, err := r.recs.GetLayerName(ctx, n); err != nil {
			return err
		}
		return r.recs.DeleteLayerName(ctx, n)
	}
	rec, err := r.layer(ctx, ref)
	if err != nil {
		return err
	}
	imgs, inames, err := r.recs.ListImages(ctx)
	if err != nil {
		return err
	}
	// Named images keep their layers; unnamed ones (inline compositions)
	// are dropped with the layer, unless a live sandbox runs them.
	var unnamed []string
	for _, img := range imgs {
		if !slices.ContainsFunc(img.Manifest.Layers, func(l store.ImageLayer) bool { return l.ID == rec.ID }) {
			continue
		}
		if n := nameOf(img.ID, inames); n != "" {
			return errdefs.New(errdefs.Conflict, api.CodeLayerInUse, "layer %s is used by image %s%s; remove the image first", rec.ID, img.ID, n)
		}
		unnamed = append(unnamed, img.ID)
	}
	if inUse != nil && inUse(rec.ID) {
		return errdefs.New(errdefs.Conflict, api.CodeLayerInUse, "layer %s is used by a live sandbox", rec.ID)
	}
	for _, id := range unnamed {
		if err := r.recs.DeleteImage(ctx, id); err != nil {
			return err
		}
		r.mu.Lock()
		delete(r.byID, id)
		r.mu.Unlock()
	}
	lnames, err := r.LayerNames(ctx, rec.ID)
	if err != nil {
		return err
	}
	for _, n := range lnames {
		if err := r.recs.DeleteLayerName(ctx, n); err != nil {
			return err
		}
	}
	if err := r.recs.DeleteLayer(ctx, rec.ID); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.layers, rec.ID)
	r.mu.Unlock()
	// Blobs another layer shares (e.g. an empty data blob) stay.
	others, _, err := r.recs.ListLayers(ctx)
	if err != nil {
		return err
	}
	for _, d := range []string{rec.Manifest.Meta.Digest, rec.Manifest.Blob.Digest} {
		shared := slices.ContainsFunc(others, func(o store.LayerRecord) bool {
			return o.Manifest.Meta.Digest == d || o.Manifest.Blob.Digest == d
		})
		if !shared {
			if err := r.blobs.Delete(ctx, d); err != nil {
				return err
			}
		}
	}
	return nil
}

func nameOf(id string, names []store.NameRecord) string {
	for _, n := range names {
		if n.ID == id {
			return " (" + n.Name + ")"
		}
	}
	return ""
}

// RegisterLayer records a layer whose files a node built and stored in
// the blob store itself (a snapshot's state layer): both files must be
// there, and the manifest valid. With uploading, the node is storing
// them still (a fork's snapshot, which its children start from in that
// node's cache meanwhile): the caller waits for the upload instead.
func (r *Registry) RegisterLayer(ctx context.Context, m layer.Manifest, uploading bool) (store.LayerRecord, error) {
	if r.blobs == nil {
		return store.LayerRecord{}, errdefs.New(errdefs.Unsupported, api.CodeNoBlobStore, "this server has no blob store")
	}
	if err := m.Validate(); err != nil {
		return store.LayerRecord{}, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidLayer, err, "the node's layer is not valid")
	}
	for _, f := range []layer.FileRef{m.Meta, m.Blob} {
		if uploading {
			break
		}
		if _, err := r.blobs.Stat(ctx, f.Digest); err != nil {
			return store.LayerRecord{}, errdefs.Within(errdefs.Invalid, api.CodeInvalidLayer, err, "the node's layer file %s is not in the blob store", f.Digest)
		}
	}
	rec := store.LayerRecord{ID: m.ID(), Manifest: m, Created: time.Now().UTC()}
	if err := r.recs.PutLayer(ctx, rec); err != nil {
		return store.LayerRecord{}, err
	}
	return r.layer(ctx, rec.ID)
}
