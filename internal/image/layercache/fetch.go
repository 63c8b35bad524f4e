package layercache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
)

// fetch copies (or links) layer hex's files from the store into
// files/<hex>, checking their digests, and returns the bytes cached. The
// files appear all at once (a rename) or not at all.
//
// Errors: class NotFound with code "layer_not_found" when the store lacks
// a file; Internal with code "layer_corrupt" on a digest or size mismatch;
// Unavailable with code "layer_cache_full" when the disk is full.
func (c *Cache) fetch(ctx context.Context, hex string, m layer.Manifest) (int64, error) {
	tmp, err := os.MkdirTemp(c.tmpDir(), "fetch-"+hex[:16]+"-")
	if err != nil {
		return 0, c.diskErr(err, "fetching layer %s", hex)
	}
	var cu cleanup.Stack
	defer cu.Clean()
	cu.Add(func() { _ = os.RemoveAll(tmp) }) // tmp is ours; New sweeps it after a crash
	var total int64
	for _, f := range fetchFiles(m, c.lazy != nil) {
		n, err := c.fetchFile(ctx, hex, f.Ref, filepath.Join(tmp, f.Name))
		if err != nil {
			return 0, err
		}
		total += n
	}
	js := m.Canonical()
	if err := writeFileSync(filepath.Join(tmp, layer.ManifestFile), js); err != nil {
		return 0, c.diskErr(err, "fetching layer %s", hex)
	}
	total += int64(len(js))
	if err := syncDir(tmp); err != nil {
		return 0, c.diskErr(err, "fetching layer %s", hex)
	}
	final := c.filesDir(hex)
	if err := c.install(tmp, final); err != nil {
		return 0, c.diskErr(err, "fetching layer %s", hex)
	}
	cu.Release()
	if err := syncDir(filepath.Dir(final)); err != nil {
		c.log.Warn("syncing layer cache directory", "err", err) // the files are there; only durability is in doubt
	}
	c.fetches.Add(1)
	c.fetchBytes.Add(total)
	return total, nil
}

// fetchFile puts the blob ref at dst: a hard link to the store's file
// when possible, else a copy. Either way the content is hashed once and
// must match ref.
func (c *Cache) fetchFile(ctx context.Context, hex string, ref layer.FileRef, dst string) (int64, error) {
	if c.paths != nil {
		if src, err := c.paths.Path(ref.Digest); err == nil {
			if err := os.Link(src, dst); err == nil {
				n, sum, err := hashFile(ctx, dst)
				if err != nil {
					return 0, errorf(err, "verifying layer %s", hex)
				}
				if err := checkRef(hex, ref, n, sum); err != nil {
					return 0, err
				}
				return n, nil
			}
			// Another file system (EXDEV), or the blob is missing (Open
			// below reports that properly): copy.
		}
	}
	rc, info, err := c.store.Open(ctx, ref.Digest)
	if errors.Is(err, errdefs.NotFound) {
		return 0, errdefs.Wrap(errdefs.NotFound, api.CodeLayerNotFound, err, "layer %s: file %s is not in the store", hex, ref.Digest)
	}
	if err != nil {
		return 0, errorf(err, "fetching layer %s", hex)
	}
	defer rc.Close()
	if info.Size != ref.Size && info.Size != 0 {
		return 0, corrupt(hex, "file %s is %d bytes in the store, want %d", ref.Digest, info.Size, ref.Size)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return 0, c.diskErr(err, "fetching layer %s", hex)
	}
	h := sha256.New()
	// Read one byte past the size so a longer blob is caught.
	n, err := io.CopyBuffer(io.MultiWriter(f, h), blobstore.ContextReader(ctx, io.LimitReader(rc, ref.Size+1)), make([]byte, 1<<20))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, c.diskErr(err, "fetching layer %s", hex)
	}
	if err := checkRef(hex, ref, n, "sha256:"+hexString(h.Sum(nil))); err != nil {
		return 0, err
	}
	return n, nil
}

// install renames the complete directory tmp to files/<hex> (final). A
// leftover directory there (an eviction that failed half-way) is not in
// the cache's books: it is replaced.
func (c *Cache) install(tmp, final string) error {
	err := os.Rename(tmp, final)
	if err == nil {
		return nil
	}
	if _, serr := os.Stat(final); serr != nil {
		return err
	}
	if err := c.removeDir(final); err != nil {
		return err
	}
	return os.Rename(tmp, final)
}

// checkRef checks a file's size and digest against ref.
func checkRef(hex string, ref layer.FileRef, n int64, digest string) error {
	if n != ref.Size || digest != ref.Digest {
		return corrupt(hex, "file %s has %d bytes with digest %s, want %d bytes", ref.Digest, n, digest, ref.Size)
	}
	return nil
}

// corrupt returns the error for a layer whose files do not match its
// manifest: class Internal, code "layer_corrupt".
func corrupt(hex, format string, args ...any) error {
	return errdefs.New(errdefs.Internal, api.CodeLayerCorrupt, "layer sha256:%s is corrupt: %s", hex, fmt.Sprintf(format, args...))
}

// verifyFiles hashes a cached layer's files against its manifest.
func verifyFiles(ctx context.Context, dir, hex string, m layer.Manifest) error {
	for _, f := range cachedFiles(dir, m) {
		n, sum, err := hashFile(ctx, filepath.Join(dir, f.Name))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return corrupt(hex, "reading %s: %v", f.Name, err)
		}
		if err := checkRef(hex, f.Ref, n, sum); err != nil {
			return err
		}
	}
	return nil
}

// hashFile returns the size and "sha256:<hex>" digest of the file at p.
func hashFile(ctx context.Context, p string) (int64, string, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, blobstore.ContextReader(ctx, f), make([]byte, 1<<20))
	if err != nil {
		return 0, "", err
	}
	return n, "sha256:" + hexString(h.Sum(nil)), nil
}

// checkCached is New's quick check of files/<hex>: layer.json parses,
// names this ID, and the two files have the manifest's sizes. It returns
// the entry's size in bytes. The digests are checked later (verifyFiles).
func checkCached(dir, hex string) (int64, time.Time, error) {
	if !validHex(hex) {
		return 0, time.Time{}, fmt.Errorf("not a layer directory")
	}
	js, err := os.ReadFile(filepath.Join(dir, layer.ManifestFile))
	if err != nil {
		return 0, time.Time{}, err
	}
	var m layer.Manifest
	if err := json.Unmarshal(js, &m); err != nil {
		return 0, time.Time{}, fmt.Errorf("decoding %s: %w", layer.ManifestFile, err)
	}
	if err := m.Validate(); err != nil {
		return 0, time.Time{}, err
	}
	if m.ID() != "sha256:"+hex {
		return 0, time.Time{}, fmt.Errorf("%s has ID %s", layer.ManifestFile, m.ID())
	}
	total := int64(len(js))
	for _, f := range cachedFiles(dir, m) {
		fi, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil {
			return 0, time.Time{}, err
		}
		if fi.Size() != f.Ref.Size {
			return 0, time.Time{}, fmt.Errorf("%s is %d bytes, want %d", f.Name, fi.Size(), f.Ref.Size)
		}
		total += fi.Size()
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, time.Time{}, err
	}
	return total, fi.ModTime(), nil
}

// removeDir removes a directory of the cache (files/<hex> or a temporary
// one) by renaming it into tmp/ first, so it vanishes at once even if the
// removal is cut short (New sweeps tmp/).
func (c *Cache) removeDir(dir string) error {
	tmp, err := os.MkdirTemp(c.tmpDir(), "rm-")
	if err != nil {
		return c.diskErr(err, "removing %s", dir)
	}
	gone := filepath.Join(tmp, "x")
	if err := os.Rename(dir, gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = os.Remove(tmp)
		return errorf(err, "removing %s", dir)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return errorf(err, "removing %s", dir)
	}
	return nil
}

// diskErr classifies a file-system error: a full disk is Unavailable
// (code "layer_cache_full", and the evictor is poked); others are wrapped
// as they are.
func (c *Cache) diskErr(err error, format string, args ...any) error {
	if sys.IsNoSpace(err) {
		c.pokeEvictor()
		e := errdefs.Wrap(errdefs.Unavailable, api.CodeLayerCacheFull, err, "%s: no space left for the layer cache", fmt.Sprintf(format, args...))
		e.RetryAfter = time.Second
		return e
	}
	return errorf(err, format, args...)
}

// writeFileSync writes a new read-only file and syncs it.
func writeFileSync(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func hexString(b []byte) string { return hex.EncodeToString(b) }

// validHex reports whether s is 64 lower-case hex digits.
func validHex(s string) bool { return layer.ValidDigest("sha256:" + s) }
