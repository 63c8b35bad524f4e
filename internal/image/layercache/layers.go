package layercache

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// maxLowerLen bounds an overlay's lowerdir option: mount options must fit
// in one page with the other options.
const maxLowerLen = 3500

// checkStack validates a layer stack (bottom first) and returns the
// layers' hex IDs.
func (c *Cache) checkStack(layers []Layer) ([]string, error) {
	if len(layers) == 0 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeNoLayers, "a layer stack needs at least one layer")
	}
	hexes := make([]string, len(layers))
	lowerLen := 0
	for i, l := range layers {
		if err := l.Manifest.Validate(); err != nil {
			return nil, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidLayer, err, "layer %s has a bad manifest", l.ID)
		}
		if id := l.Manifest.ID(); l.ID != id {
			return nil, errdefs.New(errdefs.Invalid, api.CodeLayerIDMismatch, "layer %s has a manifest of layer %s", l.ID, id)
		}
		hexes[i] = strings.TrimPrefix(l.ID, "sha256:")
		for _, h := range hexes[:i] {
			if h == hexes[i] {
				return nil, errdefs.New(errdefs.Invalid, api.CodeDuplicateLayer, "layer %s appears twice in the stack", l.ID)
			}
		}
		lowerLen += len(c.mntDir(hexes[i])) + 1
	}
	if lowerLen > maxLowerLen {
		return nil, errdefs.New(errdefs.Invalid, api.CodeTooManyLayers, "a stack of %d layers is too deep for an overlay here", len(layers))
	}
	return hexes, nil
}

// lowers returns the mount points of hexes (bottom first) top first, as
// overlay's lowerdir wants them.
func (c *Cache) lowers(hexes []string) []string {
	out := make([]string, len(hexes))
	for i, h := range hexes {
		out[len(hexes)-1-i] = c.mntDir(h)
	}
	return out
}

// viewKey names the view of a stack: the hex SHA-256 of its layer IDs,
// bottom first.
func viewKey(layers []Layer) string {
	h := sha256.New()
	for _, l := range layers {
		h.Write([]byte(l.ID))
		h.Write([]byte{'\n'})
	}
	return hexString(h.Sum(nil))
}

// acquireLayers makes sure every layer is cached and mounted and takes a
// reference on each mount; releaseLayers gives them back. Layers that need
// work are fetched and mounted concurrently.
func (c *Cache) acquireLayers(ctx context.Context, layers []Layer, hexes []string) ([]*layerEntry, error) {
	// Fast path: everything mounted already.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, closedErr()
	}
	es := make([]*layerEntry, len(hexes))
	all := true
	for i, h := range hexes {
		e := c.layers[h]
		if e == nil || !e.mounted || e.busy != nil {
			all = false
			break
		}
		es[i] = e
	}
	if all {
		now := time.Now()
		for _, e := range es {
			e.refs++
			e.lastUsed = now
		}
		c.mu.Unlock()
		c.hits.Add(int64(len(es)))
		return es, nil
	}
	c.mu.Unlock()

	errs := make([]error, len(hexes))
	if len(hexes) == 1 {
		es[0], errs[0] = c.acquireLayer(ctx, layers[0], hexes[0])
	} else {
		var wg sync.WaitGroup
		for i := range hexes {
			wg.Go(func() { es[i], errs[i] = c.acquireLayer(ctx, layers[i], hexes[i]) })
		}
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		var got []*layerEntry
		for _, e := range es {
			if e != nil {
				got = append(got, e)
			}
		}
		c.releaseLayers(got)
		for _, err := range errs {
			if err != nil {
				return nil, err // the first error keeps its class and code
			}
		}
	}
	return es, nil
}

// acquireLayer is acquireLayers for one layer: concurrent calls for the
// same layer share one fetch and one mount.
func (c *Cache) acquireLayer(ctx context.Context, l Layer, hex string) (*layerEntry, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, closedErr()
		}
		e := c.layers[hex]
		if e == nil {
			e = &layerEntry{hex: hex}
			c.layers[hex] = e
		}
		if f := e.busy; f != nil {
			c.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if f.err != nil && !isContextErr(f.err) {
				return nil, f.err
			}
			continue // look again; a cancelled leader is replaced
		}
		if e.mounted && (c.idmap == nil || e.idmapped) {
			e.refs++
			e.lastUsed = time.Now()
			c.mu.Unlock()
			c.hits.Add(1)
			return e, nil
		}
		f := newFlight()
		e.busy = f
		cached, verified := e.cached, e.verified
		c.mu.Unlock()

		err := c.prepareLayer(ctx, e, l, cached, verified)

		c.mu.Lock()
		e.busy = nil
		f.err = err
		if err == nil {
			e.mounted = true
			e.idmapped = c.idmap != nil
			e.refs++
			e.lastUsed = time.Now()
		}
		c.dropIfUnusedLocked(e)
		c.mu.Unlock()
		close(f.done)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
}

// prepareLayer brings an unmounted layer to the point of being mounted:
// it checks cached files not yet verified (removing them if bad), fetches
// missing ones and mounts mnt/<hex>. The caller holds e.busy.
func (c *Cache) prepareLayer(ctx context.Context, e *layerEntry, l Layer, cached, verified bool) error {
	hex := e.hex
	if e.mounted { // only its id-mapped clone is missing (e.g. adopted)
		return c.mountLayer(ctx, e)
	}
	if cached && c.lazy == nil && lazyCached(c.filesDir(hex)) {
		// Cached lazily by a run with on-demand loading on: without it,
		// the layer is fetched whole.
		if err := c.dropFiles(e); err != nil {
			return err
		}
		cached = false
	}
	if cached && !verified {
		if err := verifyFiles(ctx, c.filesDir(hex), hex, l.Manifest); err != nil {
			if isContextErr(err) {
				return err
			}
			c.log.Warn("cached layer is corrupt; fetching it again", "layer", l.ID, "err", err)
			if err := c.dropFiles(e); err != nil {
				return err
			}
			cached = false
		} else {
			c.mu.Lock()
			e.verified = true
			c.mu.Unlock()
		}
	}
	if !cached {
		n, err := c.fetch(ctx, hex, l.Manifest)
		if err != nil {
			return err
		}
		c.log.Info("fetched layer", "layer", l.ID, "bytes", n)
		c.mu.Lock()
		e.cached, e.verified, e.size = true, true, n
		c.bytes += n
		over := c.bytes > c.budget
		c.mu.Unlock()
		if over {
			c.pokeEvictor()
		}
	} else {
		c.hits.Add(1)
	}
	return c.mountLayer(ctx, e)
}

// mountLayer mounts files/<hex> at mnt/<hex> unless it is mounted, and,
// with an IDMap, its id-mapped clone at idmap/<hex>, leaving nothing
// behind if it fails. The caller holds e.busy.
func (c *Cache) mountLayer(ctx context.Context, e *layerEntry) error {
	hex := e.hex
	target := c.mntDir(hex)
	var cu cleanup.Stack
	defer cu.Clean()
	if !e.mounted {
		if err := os.Mkdir(target, 0o755); err == nil {
			cu.Add(func() { _ = os.Remove(target) })
		} else if !errors.Is(err, os.ErrExist) {
			return c.diskErr(err, "mounting layer %s", hex)
		}
		if err := c.mountErofs(ctx, e, target); err != nil {
			return err
		}
		cu.Add(func() { _ = sys.Unmount(target) })
	}
	if c.idmap != nil && !e.idmapped {
		clone := c.idmapDir(hex)
		if err := os.Mkdir(clone, 0o755); err == nil {
			cu.Add(func() { _ = os.Remove(clone) })
		} else if !errors.Is(err, os.ErrExist) {
			return c.diskErr(err, "id-mapping layer %s", hex)
		}
		if err := sys.IDMappedClone(target, clone, c.idmap.UsernsFd); err != nil {
			return errdefs.Wrap(errdefs.Internal, api.CodeLayerIDMapFailed, err, "id-mapping layer sha256:%s", hex)
		}
	}
	cu.Release()
	return nil
}

// rootLowers are a root's lower directories: the layers' id-mapped
// clones with an IDMap, else their mounts.
func (c *Cache) rootLowers(hexes []string) []string {
	if c.idmap == nil {
		return c.lowers(hexes)
	}
	out := make([]string, len(hexes))
	for i, h := range hexes {
		out[len(hexes)-1-i] = c.idmapDir(h)
	}
	return out
}

// dropFiles removes a layer's cached files (the caller holds e.busy and
// the layer is not mounted).
func (c *Cache) dropFiles(e *layerEntry) error {
	c.forgetLazy(context.Background(), e.hex)
	if err := c.removeDir(c.filesDir(e.hex)); err != nil {
		return err
	}
	c.mu.Lock()
	if e.cached {
		c.bytes -= e.size
	}
	e.cached, e.verified, e.size = false, false, 0
	c.mu.Unlock()
	return nil
}

// releaseLayers drops one reference on each layer mount. The mounts stay
// until GC.
func (c *Cache) releaseLayers(es []*layerEntry) {
	if len(es) == 0 {
		return
	}
	c.mu.Lock()
	c.releaseLayersLocked(es)
	c.mu.Unlock()
}

// releaseLayersLocked is releaseLayers.
//
// Preconditions: c.mu must be held.
func (c *Cache) releaseLayersLocked(es []*layerEntry) {
	now := time.Now()
	for _, e := range es {
		if e.refs <= 0 {
			c.log.Error("layer reference count below zero", "layer", e.hex)
			continue
		}
		e.refs--
		e.lastUsed = now
	}
}

// dropIfUnusedLocked forgets a layer entry that holds nothing.
//
// Preconditions: c.mu must be held.
func (c *Cache) dropIfUnusedLocked(e *layerEntry) {
	if !e.cached && !e.mounted && e.refs == 0 && e.busy == nil && c.layers[e.hex] == e {
		delete(c.layers, e.hex)
	}
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
