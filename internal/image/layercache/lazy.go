package layercache

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/lazyblob"
	"github.com/dsec-dev/dsec/internal/sys"
)

// LazyBlobs serves layers' data blobs on demand: lazyblob.Server.
type LazyBlobs interface {
	// Add serves the blob idx indexes, read from src, and returns the
	// path of its file.
	Add(ctx context.Context, idx chunks.Index, src lazyblob.Source) (string, error)
	// Remove stops serving the blob under its name (a mount holding
	// the file keeps reading it).
	Remove(ctx context.Context, digest string) error
}

// A layer cached lazily has, in files/<hex>, its metadata, its chunk
// index and layer.json, but no data.blob: its data comes through the
// LazyBlobs file. A layer cached whole has data.blob (and may have no
// index).

// fetchFiles are the files a fetch of m copies: without the blob when
// the layer is to be loaded lazily.
func fetchFiles(m layer.Manifest, lazy bool) []layer.File {
	if lazy && m.HasChunks() {
		return []layer.File{{Name: layer.MetaFile, Ref: m.Meta}, {Name: layer.ChunksFile, Ref: m.Chunks}}
	}
	return []layer.File{{Name: layer.MetaFile, Ref: m.Meta}, {Name: layer.BlobFile, Ref: m.Blob}}
}

// cachedFiles are the files files/<hex> (dir) holds for m.
func cachedFiles(dir string, m layer.Manifest) []layer.File {
	return fetchFiles(m, lazyCached(dir))
}

// lazyCached reports whether files/<hex> holds a layer cached lazily.
func lazyCached(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, layer.BlobFile))
	return errors.Is(err, fs.ErrNotExist)
}

// blobPath returns the data blob to mount layer hex with: its file in
// files/<hex>, or for a lazily cached layer the file LazyBlobs serves.
func (c *Cache) blobPath(ctx context.Context, hex string) (string, error) {
	files := c.filesDir(hex)
	if !lazyCached(files) {
		return filepath.Join(files, layer.BlobFile), nil
	}
	if c.lazy == nil {
		// Cached lazily by an earlier run with on-demand loading on;
		// prepareLayer fetches such files again before mounting.
		return "", errdefs.New(errdefs.Internal, api.CodeLayerCorrupt, "layer sha256:%s is cached without its data, and on-demand loading is off", hex)
	}
	idx, err := readIndex(files)
	if err != nil {
		return "", corrupt(hex, "%v", err)
	}
	return c.lazy.Add(ctx, idx, c.store)
}

// readIndex reads the chunk index in a layer's files directory (its
// digest was checked against the manifest when it was fetched or
// verified).
func readIndex(dir string) (chunks.Index, error) {
	b, err := os.ReadFile(filepath.Join(dir, layer.ChunksFile))
	if err != nil {
		return chunks.Index{}, err
	}
	return chunks.Parse(b)
}

// forgetLazy stops serving a lazily cached layer's blob whose files are
// being removed (its chunks stay in the chunk cache).
func (c *Cache) forgetLazy(ctx context.Context, hex string) {
	if c.lazy == nil || !lazyCached(c.filesDir(hex)) {
		return
	}
	idx, err := readIndex(c.filesDir(hex))
	if err != nil {
		return // never served: Add parses the same file
	}
	if err := c.lazy.Remove(ctx, idx.Digest); err != nil {
		c.log.Warn("removing a lazily loaded blob", "layer", hex, "err", err)
	}
}

// dropDeadLazyMounts detaches, at New, the mounts of layers an earlier
// process loaded lazily, and the views over them: their data came
// through that process's FUSE file, whose connection ended with it, so
// every read that misses the page cache fails. They are mounted again,
// over this process's LazyBlobs, when next asked for. A sandbox root
// adopted over one keeps the dead mount (it cannot be moved under a
// running sandbox): its reads of data not yet in its page cache fail,
// which is logged here. (A loader that outlives the node process, so
// that a restart keeps lazily loaded sandboxes reading, is not built.)
func (c *Cache) dropDeadLazyMounts() {
	var dead []string
	for hex, e := range c.layers {
		if e.mounted && e.cached && lazyCached(c.filesDir(hex)) {
			dead = append(dead, hex)
		}
	}
	for _, hex := range dead {
		e := c.layers[hex]
		mnt := c.mntDir(hex)
		for key, v := range c.views {
			if strings.Contains(v.options, mnt) {
				c.log.Warn("detaching a view over a lazily loaded layer of an earlier run", "view", key, "layer", hex)
				if err := sys.DetachMount(c.viewDir(key)); err != nil {
					c.log.Warn("detaching a view", "view", key, "err", err)
					continue
				}
				delete(c.views, key)
			}
		}
		for id, r := range c.roots {
			if strings.Contains(r.options, mnt) || strings.Contains(r.options, c.idmapDir(hex)) {
				c.log.Warn("a sandbox root adopted over a lazily loaded layer of an earlier run: its reads of data not read before the restart fail", "root", id, "layer", hex)
			}
		}
		c.log.Warn("detaching a lazily loaded layer of an earlier run; it is mounted again when used", "layer", hex)
		if e.idmapped {
			if err := sys.DetachMount(c.idmapDir(hex)); err != nil {
				c.log.Warn("detaching a layer's id-mapped clone", "layer", hex, "err", err)
				continue
			}
			e.idmapped = false
		}
		if err := sys.DetachMount(mnt); err != nil {
			c.log.Warn("detaching a layer", "layer", hex, "err", err)
			continue
		}
		e.mounted = false
	}
}
