package layer

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// blockSize is the EROFS block size of go-erofs images and the alignment
// of file data in their blobs.
const blockSize = 4096

// AUFS whiteout names used by OCI layers.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// kindWhiteout is an overlay whiteout (a character device 0/0), which
// only state layers hold.
const kindWhiteout = 'w'

// inode is a file's metadata and data location; hard links share one.
type inode struct {
	kind   byte // kindFile, kindDir, kindSymlink or (state layers) kindWhiteout
	mode   uint32
	uid    uint32
	gid    uint32
	xattrs map[string]string
	target string // symlink target
	off    int64  // regular file: offset of the data in data.blob
	size   int64
	layer  int // the layer whose archive created the inode
	nlink  uint32
	// mtime is kept by state layers; archives' layers fix it at 0.
	mtime   uint64
	mtimeNs uint32
}

// node is a name in the tree.
type node struct {
	name     string
	parent   *node
	ino      *inode
	children map[string]*node // directories only
	// layer is the last layer that declared this node or something below
	// it. Whiteouts and opaque markers of layer L hide what layers below L
	// put there, not what L itself did.
	layer int
	// placeholder marks an extra name of a hard-linked file (see writeMeta).
	placeholder bool
}

func (n *node) path() string {
	if n.parent == nil {
		return ""
	}
	if n.parent.parent == nil {
		return n.name
	}
	return n.parent.path() + "/" + n.name
}

// tree is the merged file tree of one or more tar layers. File data goes
// to data.blob as it streams in, so memory holds only metadata.
type tree struct {
	root *node
	blob *blobWriter
}

func newTree(blob *os.File) *tree {
	return &tree{
		root: &node{children: map[string]*node{}, ino: &inode{kind: kindDir, mode: 0o755}, layer: -1},
		blob: &blobWriter{f: blob, dedup: map[[sha256.Size]byte]blobRange{}},
	}
}

// addLayer applies every entry of a tar stream as layer number layer.
// With whiteouts, AUFS whiteout files delete what lower layers put at
// their name and opaque markers hide a directory's lower contents; the
// markers themselves never enter the tree. Without, they are ordinary
// files.
func (t *tree) addLayer(ctx context.Context, r *tarReader, layer int, whiteouts bool) error {
	for i := 0; ; i++ {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		e, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := t.add(ctx, r, e, layer, whiteouts); err != nil {
			return err
		}
	}
}

func (t *tree) add(ctx context.Context, r io.Reader, e *tarEntry, layer int, whiteouts bool) error {
	if e.Path == "" {
		t.root.ino = &inode{kind: kindDir, mode: e.Mode, uid: e.UID, gid: e.GID, xattrs: e.Xattrs, layer: layer}
		t.root.layer = layer
		return nil
	}
	dirPath, name := "", e.Path
	if i := strings.LastIndexByte(e.Path, '/'); i >= 0 {
		dirPath, name = e.Path[:i], e.Path[i+1:]
	}
	if whiteouts {
		if strings.HasPrefix(dirPath, whiteoutPrefix) || strings.Contains(dirPath, "/"+whiteoutPrefix) {
			return errdefs.New(errdefs.Invalid, api.CodeTarMalformed, "archive entry %q lies inside a whiteout", truncName(e.Path))
		}
		if strings.HasPrefix(name, whiteoutPrefix) {
			return t.whiteout(dirPath, name, e.Path, layer)
		}
	}
	dir, err := t.parentDir(dirPath, e.Path, layer)
	if err != nil {
		return err
	}
	old := dir.children[name]
	switch e.Kind {

	case kindDir:
		ino := &inode{kind: kindDir, mode: e.Mode, uid: e.UID, gid: e.GID, xattrs: e.Xattrs, layer: layer}
		if old != nil && old.ino.kind == kindDir {
			old.ino, old.layer = ino, layer // keep the contents
			return nil
		}
		dir.children[name] = &node{name: name, parent: dir, ino: ino, children: map[string]*node{}, layer: layer}
	case kindSymlink:
		ino := &inode{kind: kindSymlink, mode: 0o777, uid: e.UID, gid: e.GID, xattrs: e.Xattrs, target: e.Link, layer: layer}
		dir.children[name] = &node{name: name, parent: dir, ino: ino, layer: layer}
	case kindHardlink:
		target, err := t.hardlinkTarget(e, layer)
		if err != nil {
			return err
		}
		dir.children[name] = &node{name: name, parent: dir, ino: target, layer: layer}
	case kindFile:
		off, err := t.blob.add(ctx, r, e.Size)
		if err != nil {
			return err
		}
		ino := &inode{kind: kindFile, mode: e.Mode, uid: e.UID, gid: e.GID, xattrs: e.Xattrs, off: off, size: e.Size, layer: layer}
		dir.children[name] = &node{name: name, parent: dir, ino: ino, layer: layer}
	}
	return nil
}

// whiteout applies an AUFS whiteout or opaque marker of layer. Markers
// in directories that do not exist hide nothing and create nothing.
func (t *tree) whiteout(dirPath, name, full string, layer int) error {
	dir := t.root
	if dirPath != "" {
		for _, c := range strings.Split(dirPath, "/") {
			next := dir.children[c]
			switch {
			case next == nil || next.ino.kind == kindFile:
				return nil
			case next.ino.kind == kindSymlink:
				return unsafePath(full, "reached through the symlink "+next.path())
			}
			dir = next
		}
	}
	switch {
	case name == whiteoutOpaque:
		pruneBelow(dir, layer)
	case strings.HasPrefix(name, whiteoutMeta):
		// Other AUFS metadata (.wh..wh.plnk, .wh..wh.aufs): ignore.
	case len(name) == len(whiteoutPrefix):
		return errdefs.New(errdefs.Invalid, api.CodeTarMalformed, "archive entry %q is a whiteout of nothing", truncName(full))
	default:
		if c := dir.children[name[len(whiteoutPrefix):]]; c != nil {
			if c.layer < layer {
				delete(dir.children, c.name)
			} else if c.children != nil {
				pruneBelow(c, layer) // re-created in this layer: hide only what is below it
			}
		}
	}
	return nil
}

// parentDir returns the directory dirPath, creating missing directories
// (mode 0755, owned by root) as tar extraction would. A component that is
// a symlink is refused: the entry would be reached through it (tar-slip).
// A file left by a lower layer is hidden by the directory, as in
// overlayfs; one from the same layer is a conflict.
func (t *tree) parentDir(dirPath, full string, layer int) (*node, error) {
	cur := t.root
	cur.layer = max(cur.layer, layer)
	if dirPath == "" {
		return cur, nil
	}
	for _, c := range strings.Split(dirPath, "/") {
		next := cur.children[c]
		switch {
		case next == nil || (next.ino.kind == kindFile && next.layer < layer):
			next = &node{name: c, parent: cur, ino: &inode{kind: kindDir, mode: 0o755, layer: layer}, children: map[string]*node{}, layer: layer}
			cur.children[c] = next
		case next.ino.kind == kindSymlink:
			return nil, unsafePath(full, "reached through the symlink "+next.path())
		case next.ino.kind != kindDir:
			return nil, errdefs.New(errdefs.Invalid, api.CodeTarPathConflict, "archive entry %q: %s is not a directory", truncName(full), next.path())
		}
		next.layer = max(next.layer, layer)
		cur = next
	}
	return cur, nil
}

// hardlinkTarget resolves a hard link's target: a regular file that this
// layer's archive already holds, reached without symlinks.
func (t *tree) hardlinkTarget(e *tarEntry, layer int) (*inode, error) {
	bad := func(why string) error {
		return errdefs.New(errdefs.Invalid, api.CodeTarHardlink, "archive hard link %q to %q: %s", truncName(e.Path), truncName(e.Link), why)
	}
	cur := t.root
	for _, c := range strings.Split(e.Link, "/") {
		if cur.ino.kind != kindDir {
			return nil, bad("the target is not reachable without symlinks")
		}
		if cur = cur.children[c]; cur == nil {
			return nil, bad("no such file earlier in the archive")
		}
	}
	if cur.ino.kind != kindFile || cur.ino.layer != layer {
		return nil, bad("the target is not a regular file earlier in the archive")
	}
	return cur.ino, nil
}

// pruneBelow hides, under n, everything lower layers put there.
func pruneBelow(n *node, layer int) {
	for name, c := range n.children {
		if c.layer < layer {
			delete(n.children, name)
		} else if c.children != nil {
			pruneBelow(c, layer)
		}
	}
}

// walk calls fn for every node in depth-first order of sorted names.
func (t *tree) walk(fn func(n *node)) {
	var rec func(n *node)
	rec = func(n *node) {
		fn(n)
		for _, name := range sortedNames(n) {
			rec(n.children[name])
		}
	}
	rec(t.root)
}

func sortedNames(n *node) []string {
	names := make([]string, 0, len(n.children))
	for name := range n.children {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// blobRange is where a file's data lies in data.blob.
type blobRange struct{ off, size int64 }

// blobWriter appends file data to data.blob, each file starting on a
// block boundary and padded with zeros. Identical files are stored once.
type blobWriter struct {
	f     *os.File
	end   int64 // block-aligned end of the data written so far
	dedup map[[sha256.Size]byte]blobRange
	buf   []byte
}

var zeroBlock [blockSize]byte

// add copies size bytes of r into the blob and returns their offset.
func (b *blobWriter) add(ctx context.Context, r io.Reader, size int64) (int64, error) {
	off, _, err := b.addSum(ctx, r, size)
	return off, err
}

// addSum is add that also returns the bytes' SHA-256.
func (b *blobWriter) addSum(ctx context.Context, r io.Reader, size int64) (int64, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if size == 0 {
		return 0, sha256.Sum256(nil), nil
	}
	if b.buf == nil {
		b.buf = make([]byte, 1<<20)
	}
	h := sha256.New()
	w := io.NewOffsetWriter(b.f, b.end)
	var n int64
	for n < size {
		if err := ctx.Err(); err != nil {
			return 0, sum, err
		}
		chunk := b.buf[:min(int64(len(b.buf)), size-n)]
		m, err := io.ReadFull(r, chunk)
		if m > 0 {
			h.Write(chunk[:m])
			if _, werr := w.Write(chunk[:m]); werr != nil {
				return 0, sum, fmt.Errorf("writing %s: %w", BlobFile, werr)
			}
			n += int64(m)
		}
		if err == io.ErrUnexpectedEOF || (err == io.EOF && n < size) {
			return 0, sum, errdefs.New(errdefs.Invalid, api.CodeTarTruncated, "the archive is truncated")
		}
		if err != nil {
			return 0, sum, err
		}
	}
	h.Sum(sum[:0])
	if r, ok := b.dedup[sum]; ok && r.size == size {
		return r.off, sum, nil // the next file overwrites what was just written
	}
	if pad := -size & (blockSize - 1); pad > 0 {
		if _, err := w.Write(zeroBlock[:pad]); err != nil {
			return 0, sum, fmt.Errorf("writing %s: %w", BlobFile, err)
		}
	}
	off := b.end
	b.dedup[sum] = blobRange{off, size}
	b.end += size + (-size & (blockSize - 1))
	return off, sum, nil
}

// finish drops data no file references any more (files replaced or
// whited out by later entries), keeping the order of the rest, and
// trims the blob to its data.
func (t *tree) finishBlob() error {
	type ref struct {
		off, size int64
		inos      []*inode
	}
	byOff := map[int64]*ref{}
	t.walk(func(n *node) {
		if n.ino.kind == kindFile && n.ino.size > 0 {
			r := byOff[n.ino.off]
			if r == nil {
				r = &ref{off: n.ino.off, size: n.ino.size}
				byOff[n.ino.off] = r
			}
			r.inos = append(r.inos, n.ino)
		}
	})
	refs := make([]*ref, 0, len(byOff))
	var live int64
	for _, r := range byOff {
		refs = append(refs, r)
		live += r.size + (-r.size & (blockSize - 1))
	}
	if live == t.blob.end {
		return t.blob.f.Truncate(t.blob.end)
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].off < refs[j].off })
	// Move each live range down to its new offset; ranges only move
	// towards the start, so copying in order never overwrites live data.
	var dst int64
	buf := make([]byte, 1<<20)
	for _, r := range refs {
		if r.off != dst {
			aligned := r.size + (-r.size & (blockSize - 1))
			for done := int64(0); done < aligned; {
				n := min(int64(len(buf)), aligned-done)
				if _, err := t.blob.f.ReadAt(buf[:n], r.off+done); err != nil {
					return fmt.Errorf("compacting %s: %w", BlobFile, err)
				}
				if _, err := t.blob.f.WriteAt(buf[:n], dst+done); err != nil {
					return fmt.Errorf("compacting %s: %w", BlobFile, err)
				}
				done += n
			}
			for _, ino := range r.inos {
				ino.off = dst
			}
		}
		dst += r.size + (-r.size & (blockSize - 1))
	}
	t.blob.end = dst
	return t.blob.f.Truncate(dst)
}
