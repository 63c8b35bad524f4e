package layercache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// recover is New's scan of the cache directory: it adopts the mounts
// under mnt/, views/ and roots/ with no references, empties tmp/, checks
// files/ and removes mount points left empty by a crash.
func (c *Cache) recover(ctx context.Context) error {
	mounts, err := sys.MountInfoUnder(c.dir)
	if err != nil {
		return errorf(err, "reading the mount table")
	}
	for _, m := range mounts {
		rel, ok := strings.CutPrefix(m.Target, c.dir+"/")
		if !ok {
			continue
		}
		kind, name, ok := strings.Cut(rel, "/")
		if !ok || strings.Contains(name, "/") {
			continue // the cache directory itself, or a sandbox's own mounts inside its root
		}
		switch {
		case kind == "mnt" && validHex(name) && m.FSType == "erofs":
			if e := c.layers[name]; e != nil {
				c.log.Warn("a layer is mounted more than once", "layer", name)
				continue
			}
			c.layers[name] = &layerEntry{hex: name, mounted: true}
		case kind == "idmap" && validHex(name) && m.FSType == "erofs":
			if e := c.layers[name]; e != nil && e.mounted {
				e.idmapped = true
				continue
			}
			// A clone without its layer mount: nothing can use it.
			if err := c.unmountDir(m.Target); err != nil {
				c.log.Warn("removing an orphan id-mapped layer mount", "mount", m.Target, "err", err)
			}
		case kind == "views" && validHex(name) && m.FSType == "overlay":
			c.views[name] = &viewEntry{key: name, mounted: true, options: m.Options}
		case kind == "roots" && rootIDPattern.MatchString(name) && m.FSType == "overlay":
			c.roots[name] = &rootEntry{id: name, options: m.Options}
		default:
			c.log.Warn("ignoring a foreign mount in the layer cache", "mount", m.Target, "type", m.FSType)
		}
	}
	c.log.Info("adopted mounts", "layers", len(c.layers), "views", len(c.views), "roots", len(c.roots))

	// Half-done fetches and removals.
	tmps, err := os.ReadDir(c.tmpDir())
	if err != nil {
		return errorf(err, "reading %s", c.tmpDir())
	}
	for _, t := range tmps {
		if err := os.RemoveAll(filepath.Join(c.tmpDir(), t.Name())); err != nil {
			return c.diskErr(err, "emptying %s", c.tmpDir())
		}
	}

	files, err := os.ReadDir(filepath.Join(c.dir, "files"))
	if err != nil {
		return errorf(err, "reading the cached layers")
	}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		hex := f.Name()
		size, mtime, err := checkCached(c.filesDir(hex), hex)
		if err != nil {
			c.log.Warn("removing a bad cached layer", "layer", hex, "err", err)
			if err := c.removeDir(c.filesDir(hex)); err != nil {
				return err
			}
			continue
		}
		e := c.layers[hex]
		if e == nil {
			e = &layerEntry{hex: hex}
			c.layers[hex] = e
		}
		e.cached, e.size, e.lastUsed = true, size, mtime
		c.bytes += size
	}

	c.dropDeadLazyMounts()

	// Mount points left empty between mkdir and mount, or unmount and
	// rmdir (a cached layer keeps its mount point: see GC). os.Remove only
	// removes empty directories.
	for kind, mounted := range map[string]func(string) bool{
		"mnt":   func(n string) bool { return c.layers[n] != nil && (c.layers[n].mounted || c.layers[n].cached) },
		"idmap": func(n string) bool { return c.layers[n] != nil && c.layers[n].idmapped },
		"views": func(n string) bool { return c.views[n] != nil },
		"roots": func(n string) bool { return c.roots[n] != nil },
	} {
		ents, err := os.ReadDir(filepath.Join(c.dir, kind))
		if err != nil {
			return errorf(err, "reading %s", kind)
		}
		for _, d := range ents {
			if !mounted(d.Name()) {
				if err := os.Remove(filepath.Join(c.dir, kind, d.Name())); err != nil {
					c.log.Warn("leaving a non-empty directory in the layer cache", "dir", filepath.Join(kind, d.Name()), "err", err)
				}
			}
		}
	}
	return nil
}

// GC unmounts what nothing references — views, roots adopted by New and
// not taken over, then layer mounts — removing their mount points, and
// evicts cached files past the budget, least recently used first. Layers
// in use are never unmounted or evicted. It returns the errors of the
// unmounts and removals that failed (the rest goes on).
func (c *Cache) GC(ctx context.Context) error {
	var errs []error

	// Views first: they hold references on layers.
	c.mu.Lock()
	var views []*viewEntry
	for _, v := range c.views {
		if v.refs == 0 && v.busy == nil && v.mounted {
			v.busy = newFlight()
			views = append(views, v)
		}
	}
	c.mu.Unlock()
	for _, v := range views {
		err := c.unmountDir(c.viewDir(v.key))
		c.mu.Lock()
		f := v.busy
		v.busy = nil
		if err != nil {
			errs = append(errs, err)
		} else {
			c.releaseLayersLocked(v.layers)
			v.mounted, v.layers = false, nil
			if c.views[v.key] == v {
				delete(c.views, v.key)
			}
		}
		c.mu.Unlock()
		close(f.done)
	}

	// Roots no one holds: adopted by New and not taken over, or left by a
	// failed release.
	c.mu.Lock()
	var roots []*rootEntry
	for _, r := range c.roots {
		if !r.active && !r.busy {
			r.busy = true
			roots = append(roots, r)
		}
	}
	c.mu.Unlock()
	for _, r := range roots {
		err := c.unmountDir(c.rootDir(r.id))
		c.mu.Lock()
		r.busy = false
		if err != nil {
			errs = append(errs, err)
		} else if c.roots[r.id] == r {
			delete(c.roots, r.id)
		}
		c.mu.Unlock()
	}

	// Layer mounts no one references. A cached layer keeps its mount point
	// for the next mount (mkdir and rmdir cost more than the mount itself
	// on some disks); eviction removes it with the files.
	c.mu.Lock()
	var layers []*layerEntry
	var keepDir []bool
	for _, e := range c.layers {
		if e.refs == 0 && e.busy == nil && e.mounted {
			e.busy = newFlight()
			layers = append(layers, e)
			keepDir = append(keepDir, e.cached)
		}
	}
	c.mu.Unlock()
	for i, e := range layers {
		var err error
		if e.idmapped {
			err = c.unmountDir(c.idmapDir(e.hex))
		}
		if err == nil {
			if keepDir[i] {
				err = sys.Unmount(c.mntDir(e.hex))
			} else {
				err = c.unmountDir(c.mntDir(e.hex))
			}
		}
		c.mu.Lock()
		f := e.busy
		e.busy = nil
		if err != nil {
			errs = append(errs, err)
		} else {
			e.mounted, e.idmapped = false, false
			c.dropIfUnusedLocked(e)
		}
		c.mu.Unlock()
		close(f.done)
	}
	if len(views)+len(roots)+len(layers) > 0 {
		c.log.Info("unmounted unused layers", "views", len(views), "roots", len(roots), "layers", len(layers))
	}

	if err := c.evict(); err != nil {
		errs = append(errs, err)
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unmountDir unmounts a mount point of the cache and removes it.
func (c *Cache) unmountDir(target string) error {
	if err := sys.Unmount(target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errorf(err, "removing mount point")
	}
	return nil
}

// evict removes the cached files of unmounted, unreferenced layers, least
// recently used first, until the cache fits its budget.
func (c *Cache) evict() error {
	// One eviction at a time: GC's waits for the evictor's, so when GC
	// returns the files it evicted are gone.
	c.evictMu.Lock()
	defer c.evictMu.Unlock()
	c.mu.Lock()
	if c.bytes <= c.budget {
		c.mu.Unlock()
		return nil
	}
	var cands []*layerEntry
	for _, e := range c.layers {
		if e.cached && !e.mounted && e.refs == 0 && e.busy == nil {
			cands = append(cands, e)
		}
	}
	slices.SortFunc(cands, func(a, b *layerEntry) int { return a.lastUsed.Compare(b.lastUsed) })
	var victims []*layerEntry
	over := c.bytes - c.budget
	for _, e := range cands {
		if over <= 0 {
			break
		}
		// Counted out now, so that a concurrent evict does not pick more.
		e.busy = newFlight()
		victims = append(victims, e)
		over -= e.size
		c.bytes -= e.size
	}
	c.mu.Unlock()

	var errs []error
	for _, e := range victims {
		c.forgetLazy(context.Background(), e.hex)
		err := c.removeDir(c.filesDir(e.hex))
		if err == nil {
			if rerr := os.Remove(c.mntDir(e.hex)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				c.log.Warn("removing an evicted layer's mount point", "layer", e.hex, "err", rerr)
			}
		}
		c.mu.Lock()
		f := e.busy
		e.busy = nil
		idle := time.Since(e.lastUsed).Round(time.Second)
		if err != nil {
			c.bytes += e.size // still there
			errs = append(errs, err)
		} else {
			e.cached, e.verified, e.size = false, false, 0
			c.dropIfUnusedLocked(e)
		}
		c.mu.Unlock()
		close(f.done)
		if err == nil {
			c.evictions.Add(1)
			c.log.Info("evicted layer", "layer", e.hex, "idle", idle)
		}
	}
	return errors.Join(errs...)
}
