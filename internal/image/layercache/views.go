package layercache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// View returns a read-only directory showing the stack (layers bottom to
// top: base first). For one layer it is that layer's own mount; for
// several, a read-only overlay over the layers' mounts at views/<key>,
// shared by every holder of the same stack. release drops the reference
// (calling it again does nothing); the overlay stays mounted until GC.
//
// Errors: class Invalid for a bad stack; NotFound ("layer_not_found") when
// a layer's files are not in the store; Internal ("layer_corrupt") when
// they do not match the manifest; Unavailable when the disk is full or
// the cache is closed.
func (c *Cache) View(ctx context.Context, layers []Layer) (dir string, release func(), err error) {
	hexes, err := c.checkStack(layers)
	if err != nil {
		return "", nil, err
	}
	if len(hexes) == 1 {
		es, err := c.acquireLayers(ctx, layers, hexes)
		if err != nil {
			return "", nil, err
		}
		return c.mntDir(hexes[0]), sync.OnceFunc(func() { c.releaseLayers(es) }), nil
	}
	key := viewKey(layers)
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return "", nil, closedErr()
		}
		v := c.views[key]
		if v == nil {
			v = &viewEntry{key: key}
			c.views[key] = v
		}
		if f := v.busy; f != nil {
			c.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return "", nil, ctx.Err()
			}
			if f.err != nil && !isContextErr(f.err) {
				return "", nil, f.err
			}
			continue
		}
		if v.mounted && v.layers != nil {
			v.refs++
			c.mu.Unlock()
			return c.viewDir(key), c.viewRelease(v), nil
		}
		// Mount it, or take over a mount New adopted.
		f := newFlight()
		v.busy = f
		adopted, options := v.mounted, v.options
		c.mu.Unlock()

		es, err := c.acquireLayers(ctx, layers, hexes)
		if err == nil {
			err = c.mountView(key, hexes, adopted, options)
			if err != nil {
				c.releaseLayers(es)
			}
		}

		// An adopted mount that is still there stays in the books.
		keep := err != nil && adopted && c.isMountPoint(c.viewDir(key))

		c.mu.Lock()
		v.busy = nil
		f.err = err
		if err == nil {
			v.mounted, v.layers, v.options = true, es, ""
			v.refs++
		} else if keep {
			// Still the adopted mount: leave it for a later View or GC.
		} else if c.views[key] == v {
			delete(c.views, key)
		}
		c.mu.Unlock()
		close(f.done)
		if err != nil {
			return "", nil, err
		}
		return c.viewDir(key), c.viewRelease(v), nil
	}
}

// viewRelease returns the release function of a view reference.
func (c *Cache) viewRelease(v *viewEntry) func() {
	return sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if v.refs <= 0 {
			c.log.Error("view reference count below zero", "view", v.key)
			return
		}
		v.refs--
	})
}

// mountView mounts the read-only overlay of hexes at views/<key>. An
// adopted mount with the expected layers is kept; one with other layers
// (which only a foreign mount could have) is replaced.
func (c *Cache) mountView(key string, hexes []string, adopted bool, options string) error {
	target := c.viewDir(key)
	lowers := c.lowers(hexes)
	if adopted {
		if optionValue(options, "lowerdir") == strings.Join(lowers, ":") {
			return nil
		}
		c.log.Warn("replacing a view mount with other layers", "view", key, "options", options)
		if err := sys.Unmount(target); err != nil {
			return errorf(err, "replacing view %s", key)
		}
	}
	var cu cleanup.Stack
	defer cu.Clean()
	if err := os.Mkdir(target, 0o755); err == nil {
		cu.Add(func() { _ = os.Remove(target) })
	} else if !errors.Is(err, os.ErrExist) {
		return c.diskErr(err, "mounting view %s", key)
	}
	if err := sys.MountOverlay(target, lowers, "", ""); err != nil {
		return errdefs.Wrap(errdefs.Internal, api.CodeViewMountFailed, err, "mounting view %s", key)
	}
	cu.Release()
	return nil
}

var rootIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Root mounts a writable overlay for sandbox id at roots/<id>: its lower
// layers are the layers' shared mounts (top first); its upperdir and
// workdir are upper/upper and upper/work, created under upper, a
// directory the caller owns (a per-sandbox tmpfs, say). The overlay is
// nosuid and nodev. release unmounts it (lazily if busy) and drops the
// layer references; calling it again does nothing.
//
// A root that New adopted is taken over as it is, provided its lower and
// upper directories are the ones asked for (else class Conflict, code
// "root_mismatch"). A root that is already held fails with Conflict,
// code "root_exists". Other errors are View's.
func (c *Cache) Root(ctx context.Context, id string, layers []Layer, upper string) (dir string, release func(), err error) {
	return c.root(ctx, id, layers, upper, false)
}

// root is Root; byFD mounts the overlay with sys.MountOverlayByFD (its
// options name no host path) and replaces an adopted root instead of
// taking it over (DetachedRoot: nothing can use a root of the host's
// table that was never detached).
func (c *Cache) root(ctx context.Context, id string, layers []Layer, upper string, byFD bool) (dir string, release func(), err error) {
	if !rootIDPattern.MatchString(id) {
		return "", nil, errdefs.New(errdefs.Invalid, api.CodeInvalidSandboxID, "sandbox ID %q cannot name a root", id)
	}
	if !filepath.IsAbs(upper) || strings.ContainsAny(upper, ",:") {
		return "", nil, errdefs.New(errdefs.Invalid, api.CodeInvalidUpper, "upper directory %q must be absolute, without ',' or ':'", upper)
	}
	upper = filepath.Clean(upper)
	hexes, err := c.checkStack(layers)
	if err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return "", nil, closedErr()
	}
	r := c.roots[id]
	adopted := false
	switch {
	case r == nil:
		r = &rootEntry{id: id}
		c.roots[id] = r
	case !r.active && !r.busy:
		adopted = true
	default:
		c.mu.Unlock()
		return "", nil, errdefs.New(errdefs.Conflict, api.CodeRootExists, "sandbox %s already has a root", id)
	}
	r.busy = true
	options := r.options
	c.mu.Unlock()

	es, err := c.acquireLayers(ctx, layers, hexes)
	if err == nil {
		err = c.mountRoot(id, hexes, upper, adopted, options, byFD)
		if err != nil {
			c.releaseLayers(es)
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	r.busy = false
	if err != nil {
		if !adopted {
			delete(c.roots, id)
		}
		return "", nil, err
	}
	r.active, r.layers, r.options = true, es, ""
	return c.rootDir(id), sync.OnceFunc(func() { c.releaseRoot(r) }), nil
}

// DetachedRoot is Root, but the overlay leaves the host's mount table
// at once: it returns a detached copy of the mount (see sys.CloneMount)
// for the caller to attach in the sandbox's own mount namespace, and
// unmounts roots/<id>. Every new mount namespace copies the host's whole
// table, so roots left in it made each sandbox's create slower by the
// number of sandboxes (~10 ms more at 1,000). The overlay lives as long
// as a mount of it does; release drops the layer references.
func (c *Cache) DetachedRoot(ctx context.Context, id string, layers []Layer, upper string) (*os.File, func(), error) {
	dir, release, err := c.root(ctx, id, layers, upper, true)
	if err != nil {
		return nil, nil, err
	}
	f, err := sys.CloneMount(dir)
	if err == nil {
		err = sys.DetachMount(dir)
	}
	if err == nil {
		c.mu.Lock()
		if r := c.roots[id]; r != nil {
			r.detached = true
		}
		c.mu.Unlock()
		_ = os.Remove(dir)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		release()
		return nil, nil, errdefs.Wrap(errdefs.Internal, api.CodeRootMountFailed, err, "detaching root of sandbox %s", id)
	}
	return f, release, nil
}

// Hold takes references on layers, as a root over them does, until
// release: a node service that adopts a running sandbox after a restart
// holds its layers, whose detached root it cannot see.
func (c *Cache) Hold(ctx context.Context, layers []Layer) (func(), error) {
	hexes, err := c.checkStack(layers)
	if err != nil {
		return nil, err
	}
	es, err := c.acquireLayers(ctx, layers, hexes)
	if err != nil {
		return nil, err
	}
	return sync.OnceFunc(func() { c.releaseLayers(es) }), nil
}

// mountRoot mounts sandbox id's overlay (see root for byFD), or checks
// an adopted one.
func (c *Cache) mountRoot(id string, hexes []string, upper string, adopted bool, options string, byFD bool) error {
	target := c.rootDir(id)
	lowers := c.rootLowers(hexes)
	upperDir, workDir := filepath.Join(upper, "upper"), filepath.Join(upper, "work")
	if adopted && byFD {
		if err := sys.Unmount(target); err != nil {
			return errdefs.Wrap(errdefs.Internal, api.CodeRootMountFailed, err, "replacing the root of sandbox %s", id)
		}
		adopted = false
	}
	if adopted {
		if optionValue(options, "lowerdir") != strings.Join(lowers, ":") || optionValue(options, "upperdir") != upperDir {
			return errdefs.New(errdefs.Conflict, api.CodeRootMismatch, "sandbox %s has a root over other layers or another upper directory", id)
		}
		return nil
	}
	var cu cleanup.Stack
	defer cu.Clean()
	for _, d := range []string{upperDir, workDir} {
		if err := os.Mkdir(d, 0o755); err == nil {
			cu.Add(func() { _ = os.RemoveAll(d) })
		} else if !errors.Is(err, os.ErrExist) {
			return c.diskErr(err, "making root of sandbox %s", id)
		}
		if c.idmap != nil {
			// Sandbox root writes (copies up) as the mapped host ids.
			if err := os.Chown(d, c.idmap.HostUID, c.idmap.HostGID); err != nil {
				return c.diskErr(err, "making root of sandbox %s", id)
			}
		}
	}
	if err := os.Mkdir(target, 0o755); err == nil {
		cu.Add(func() { _ = os.Remove(target) })
	} else if !errors.Is(err, os.ErrExist) {
		return c.diskErr(err, "making root of sandbox %s", id)
	}
	mount := sys.MountOverlay
	if byFD {
		mount = sys.MountOverlayByFD
	}
	if err := mount(target, lowers, upperDir, workDir); err != nil {
		return errdefs.Wrap(errdefs.Internal, api.CodeRootMountFailed, err, "mounting root of sandbox %s", id)
	}
	cu.Release()
	return nil
}

// releaseRoot unmounts a root and drops its layer references. If the
// unmount fails the root is kept, unheld, for GC to try again; release
// cannot report the error, so it is logged.
func (c *Cache) releaseRoot(r *rootEntry) {
	c.mu.Lock()
	r.busy = true
	es := r.layers
	r.active, r.layers = false, nil
	c.mu.Unlock()

	target := c.rootDir(r.id)
	var err error
	if !r.detached {
		err = sys.Unmount(target)
	}
	if err == nil {
		if rerr := os.Remove(target); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			c.log.Warn("removing a root's mount point", "sandbox", r.id, "err", rerr)
		}
	} else {
		c.log.Warn("unmounting a sandbox root; GC will retry", "sandbox", r.id, "err", err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	r.busy = false
	if err == nil && c.roots[r.id] == r {
		delete(c.roots, r.id)
	}
	// A root that stays mounted after a failed unmount still uses its
	// layers; it holds them as adopted roots do: not at all. GC unmounts
	// it before it unmounts layers.
	c.releaseLayersLocked(es)
}

// isMountPoint reports whether dir is in the mount table (for error
// paths: it reads the whole table).
func (c *Cache) isMountPoint(dir string) bool {
	ms, err := sys.MountsUnder(dir)
	return err != nil || slices.Contains(ms, dir) // unknown counts as mounted: GC will look
}

// optionValue returns the value of key in a comma-separated option list.
func optionValue(options, key string) string {
	for _, o := range strings.Split(options, ",") {
		if k, v, ok := strings.Cut(o, "="); ok && k == key {
			return v
		}
	}
	return ""
}
