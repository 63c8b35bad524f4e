package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"

	"github.com/erofs/go-erofs"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

// A layer's files, read from its EROFS metadata in the blob store (the
// file data only when a file is read). Sealed grading asks which paths a
// tests layer provides, and reads the tests it declares.

const (
	// maxLayerMeta bounds the metadata read to list a layer's files.
	maxLayerMeta = 256 << 20
	// maxLayerEntries bounds the entries listed.
	maxLayerEntries = 1 << 20
	// layerFileCache is how many layers' listings are kept (layers are
	// immutable: a listing never goes stale).
	layerFileCache = 16
)

// LayerPaths returns every path layer id (an ID) has, absolute, each
// mapped to whether it is a directory. It fails with class TooLarge
// beyond 2^20 entries.
func (r *Registry) LayerPaths(ctx context.Context, id string) (map[string]bool, error) {
	r.mu.Lock()
	i := slices.IndexFunc(r.pathCache, func(c cachedPaths) bool { return c.id == id })
	if i >= 0 {
		paths := r.pathCache[i].paths
		r.mu.Unlock()
		return paths, nil
	}
	r.mu.Unlock()
	fsys, err := r.layerFS(ctx, id)
	if err != nil {
		return nil, err
	}
	paths := map[string]bool{}
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if len(paths) == maxLayerEntries {
			return errdefs.New(errdefs.TooLarge, api.CodeLayerTooLarge, "layer %s has more than %d entries", id, maxLayerEntries)
		}
		paths["/"+p] = d.IsDir()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing layer %s: %w", id, err)
	}
	r.mu.Lock()
	r.pathCache = append(r.pathCache, cachedPaths{id: id, paths: paths})
	if len(r.pathCache) > layerFileCache {
		r.pathCache = r.pathCache[1:]
	}
	r.mu.Unlock()
	return paths, nil
}

// ReadLayerFile returns the content of the regular file at p (absolute)
// in layer id (an ID), at most max bytes. A file the layer lacks is an
// error of class NotFound; a larger one of class TooLarge.
func (r *Registry) ReadLayerFile(ctx context.Context, id, p string, max int64) ([]byte, error) {
	fsys, err := r.layerFS(ctx, id)
	if err != nil {
		return nil, err
	}
	name := path.Clean(p)[1:]
	if name == "" {
		name = "."
	}
	fi, err := fs.Stat(fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.New(errdefs.NotFound, api.CodeFileNotFound, "layer %s has no %s", id, p)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s of layer %s: %w", p, id, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errdefs.New(errdefs.Invalid, api.CodeNotAFile, "%s of layer %s is not a regular file", p, id)
	}
	if fi.Size() > max {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeFileTooLarge, "%s of layer %s is larger than %d bytes", p, id, max)
	}
	f, err := fsys.Open(name)
	if err != nil {
		return nil, fmt.Errorf("reading %s of layer %s: %w", p, id, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s of layer %s: %w", p, id, err)
	}
	if int64(len(b)) > max {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeFileTooLarge, "%s of layer %s is larger than %d bytes", p, id, max)
	}
	return b, nil
}

type cachedPaths struct {
	id    string
	paths map[string]bool
}

// layerFS opens layer id's file system: its metadata read whole (it is
// small: file data lives in the blob), its data read by range on demand.
func (r *Registry) layerFS(ctx context.Context, id string) (fs.FS, error) {
	if r.blobs == nil {
		return nil, errdefs.New(errdefs.Unsupported, api.CodeNoBlobStore, "this server has no blob store")
	}
	rec, err := r.layer(ctx, id)
	if err != nil {
		return nil, err
	}
	meta, err := r.readMeta(ctx, rec)
	if err != nil {
		return nil, err
	}
	fsys, err := erofs.Open(bytes.NewReader(meta), erofs.WithExtraDevices(blobReaderAt{ctx: ctx, r: r, digest: rec.Manifest.Blob.Digest}))
	if err != nil {
		return nil, fmt.Errorf("opening layer %s: %w", id, err)
	}
	return fsys, nil
}

func (r *Registry) readMeta(ctx context.Context, rec store.LayerRecord) ([]byte, error) {
	if rec.Manifest.Meta.Size > maxLayerMeta {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeLayerTooLarge, "the metadata of layer %s is larger than %d bytes", rec.ID, maxLayerMeta)
	}
	rc, _, err := r.blobs.Open(ctx, rec.Manifest.Meta.Digest)
	if err != nil {
		return nil, fmt.Errorf("reading layer %s: %w", rec.ID, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxLayerMeta+1))
	if err != nil {
		return nil, fmt.Errorf("reading layer %s: %w", rec.ID, err)
	}
	return b, nil
}

// blobReaderAt reads a layer's data blob by range from the blob store.
// It holds the context of the one call that made it (io.ReaderAt has
// none), and lives no longer than that call.
type blobReaderAt struct {
	ctx    context.Context
	r      *Registry
	digest string
}

func (b blobReaderAt) ReadAt(p []byte, off int64) (int, error) {
	rc, err := b.r.blobs.ReadRange(b.ctx, b.digest, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return n, err
}
