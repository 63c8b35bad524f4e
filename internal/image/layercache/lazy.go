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
	// CompleteFile returns a local file holding the whole blob, checked,
	// once every chunk of it has been fetched.
	CompleteFile(digest string) (string, bool)
	// Prefetch fetches the listed chunks of a served blob in the
	// background, ahead of its readers.
	Prefetch(digest string, order []int)
}

// Profiles gives a blob's access profile: the chunks its readers asked
// for first, in order (profiles.Store); nil if it has none.
type Profiles interface {
	Profile(ctx context.Context, digest string) ([]int, error)
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
// files/<hex>, or for a lazily cached layer (lazy) the file LazyBlobs
// serves.
func (c *Cache) blobPath(ctx context.Context, hex string) (path string, lazy bool, err error) {
	files := c.filesDir(hex)
	if !lazyCached(files) {
		return filepath.Join(files, layer.BlobFile), false, nil
	}
	if c.lazy == nil {
		// Cached lazily by an earlier run with on-demand loading on;
		// prepareLayer fetches such files again before mounting.
		return "", true, errdefs.New(errdefs.Internal, api.CodeLayerCorrupt, "layer sha256:%s is cached without its data, and on-demand loading is off", hex)
	}
	idx, err := readIndex(files)
	if err != nil {
		return "", true, corrupt(hex, "%v", err)
	}
	if path, err = c.lazy.Add(ctx, idx, c.store); err != nil {
		return path, true, err
	}
	c.prefetch(ctx, idx.Digest)
	return path, true, nil
}

// prefetch starts fetching the chunks of blob digest that its access
// profile lists. A profile that cannot be read costs only the prefetch.
func (c *Cache) prefetch(ctx context.Context, digest string) {
	if c.prof == nil {
		return
	}
	order, err := c.prof.Profile(ctx, digest)
	if err != nil {
		c.log.Warn("reading a layer's access profile; not prefetching", "blob", digest, "err", err)
		return
	}
	if len(order) > 0 {
		c.lazy.Prefetch(digest, order)
	}
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

// LayerFile is where a layer's two EROFS files are on the node: the
// metadata in the cache's files, the data blob there too or, for a layer
// loaded lazily, the file the lazy server serves.
type LayerFile struct {
	Meta, Blob string
}

// Files makes layers available as files (fetched, or served on demand)
// and keeps them from eviction until release, as Hold does; the VM
// tiers give them to their guests as disks.
func (c *Cache) Files(ctx context.Context, layers []Layer) ([]LayerFile, func(), error) {
	release, err := c.Hold(ctx, layers)
	if err != nil {
		return nil, nil, err
	}
	out := make([]LayerFile, len(layers))
	for i, l := range layers {
		hex := strings.TrimPrefix(l.ID, "sha256:")
		blob, _, err := c.blobPath(ctx, hex)
		if err != nil {
			release()
			return nil, nil, err
		}
		out[i] = LayerFile{Meta: filepath.Join(c.filesDir(hex), layer.MetaFile), Blob: blob}
	}
	return out, release, nil
}

// mountErofs mounts layer e at target: over its data blob in files/,
// or over the lazy server's file, then with a chunk's readahead. A lazily
// loaded layer whose every chunk has been fetched is first made a whole
// one (promote), so that it is mounted over a local file from then on.
// The caller holds e.busy.
func (c *Cache) mountErofs(ctx context.Context, e *layerEntry, target string) error {
	hex := e.hex
	c.promote(e)
	meta := filepath.Join(c.filesDir(hex), layer.MetaFile)
	blob, lazy, err := c.blobPath(ctx, hex)
	if err != nil {
		return err
	}
	if !lazy {
		err = sys.MountErofs(meta, blob, target)
	} else {
		var tuned bool
		tuned, err = sys.MountErofsReadahead(meta, blob, target, lazyblob.ReadaheadKB)
		if err == nil && !tuned {
			c.log.Info("a lazily loaded layer keeps the default readahead: another EROFS mount was made at the same moment", "layer", hex)
		}
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, api.CodeLayerMountFailed, err, "mounting layer sha256:%s", hex)
	}
	return nil
}

// promote makes a lazily cached layer whose blob the lazy server holds
// whole a layer cached whole: its chunk cache's data file, hard-linked as
// files/<hex>/data.blob (the same inode: no copy). Mounts made from then
// on read it directly, at a local file's speed, and survive a restart of
// the node; mounts made before keep reading through the server. The
// caller holds e.busy.
func (c *Cache) promote(e *layerEntry) {
	files := c.filesDir(e.hex)
	if c.lazy == nil || !lazyCached(files) {
		return
	}
	idx, err := readIndex(files)
	if err != nil {
		return
	}
	p, ok := c.lazy.CompleteFile(idx.Digest)
	if !ok {
		return
	}
	if err := os.Link(p, filepath.Join(files, layer.BlobFile)); err != nil {
		c.log.Warn("linking a lazily loaded layer's complete blob", "layer", e.hex, "err", err)
		return
	}
	c.mu.Lock()
	e.size += idx.Size
	c.bytes += idx.Size
	c.mu.Unlock()
	c.log.Info("a lazily loaded layer is complete: mounted over its local file from now on", "layer", e.hex)
}
