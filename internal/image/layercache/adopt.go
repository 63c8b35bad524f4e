package layercache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/image/layer"
)

// Adopt puts a layer this node has just built (a snapshot's state layer)
// into the cache, so that sandboxes started from it here mount it without
// fetching back what the node itself stored. The artifact's files were
// hashed by the build that wrote them; they are hard-linked (copied
// across file systems) into files/<hex> as a fetch would place them, and
// the next restart verifies them like any cached layer. A layer the
// cache holds or is fetching already is left alone.
func (c *Cache) Adopt(ctx context.Context, art layer.Artifact) error {
	hex := strings.TrimPrefix(art.ID(), "sha256:")
	if !validHex(hex) {
		return fmt.Errorf("adopting layer %s: not a layer ID", art.ID())
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return closedErr()
	}
	e := c.layers[hex]
	if e != nil && (e.cached || e.busy != nil) {
		c.mu.Unlock()
		return nil
	}
	if e == nil {
		e = &layerEntry{hex: hex}
		c.layers[hex] = e
	}
	f := newFlight()
	e.busy = f
	c.mu.Unlock()

	n, err := c.adoptFiles(ctx, hex, art)

	c.mu.Lock()
	e.busy = nil
	f.err = err
	over := false
	if err == nil {
		e.cached, e.verified, e.size, e.lastUsed = true, true, n, time.Now()
		c.bytes += n
		over = c.bytes > c.budget
	}
	c.dropIfUnusedLocked(e)
	c.mu.Unlock()
	close(f.done)
	if over {
		c.pokeEvictor()
	}
	return err
}

// adoptFiles links (or copies) the artifact's meta.erofs and data.blob
// and writes its layer.json into a temporary directory, renamed to
// files/<hex> when complete. It returns the bytes cached.
func (c *Cache) adoptFiles(ctx context.Context, hex string, art layer.Artifact) (int64, error) {
	tmp, err := os.MkdirTemp(c.tmpDir(), "adopt-"+hex[:16]+"-")
	if err != nil {
		return 0, c.diskErr(err, "adopting layer %s", hex)
	}
	var cu cleanup.Stack
	defer cu.Clean()
	cu.Add(func() { _ = os.RemoveAll(tmp) }) // tmp is ours; New sweeps it after a crash
	m := art.Manifest
	var total int64
	for _, f := range fetchFiles(m, false) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n, err := linkOrCopy(filepath.Join(art.Dir, f.Name), filepath.Join(tmp, f.Name))
		if err != nil {
			return 0, c.diskErr(err, "adopting layer %s", hex)
		}
		if n != f.Ref.Size {
			return 0, corrupt(hex, "built file %s is %d bytes, the manifest says %d", f.Name, n, f.Ref.Size)
		}
		total += n
	}
	js := m.Canonical()
	if err := os.WriteFile(filepath.Join(tmp, layer.ManifestFile), js, 0o444); err != nil {
		return 0, c.diskErr(err, "adopting layer %s", hex)
	}
	total += int64(len(js))
	if err := c.install(tmp, c.filesDir(hex)); err != nil {
		return 0, c.diskErr(err, "adopting layer %s", hex)
	}
	cu.Release()
	return total, nil
}

// linkOrCopy hard-links src at dst, or copies it where a link cannot be
// made (another file system), and returns its size.
func linkOrCopy(src, dst string) (int64, error) {
	if err := os.Link(src, dst); err == nil {
		fi, err := os.Stat(dst)
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, errors.Join(err, os.Remove(dst))
	}
	return n, nil
}
