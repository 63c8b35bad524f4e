package layer

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// TreeDigest returns the canonical digest of the directory tree at root:
// a depth-first walk in byte order of names that hashes, per entry, its
// path relative to root, type, permission bits (with setuid, setgid and
// sticky), uid, gid, and then the content SHA-256 and size of a regular
// file, the target of a symlink, and the sorted xattrs. A regular file
// that shares its inode with an earlier path records that path instead of
// its content, so hard-link identity is part of the digest. Times are
// not hashed (layers fix them at 0).
//
// Device nodes, FIFOs and sockets are refused with errdefs.Invalid (codes
// "device_node" and "special_file"): layers do not carry them.
func TreeDigest(ctx context.Context, root string) (string, error) {
	return treeDigest(ctx, root, false)
}

// treeDigest is TreeDigest; with whiteouts, character devices 0/0
// (overlay whiteouts) are accepted and hashed as such ("w"), and every
// other device node is still refused.
func treeDigest(ctx context.Context, root string, whiteouts bool) (string, error) {
	return walkTree(ctx, root, whiteouts, nil)
}

// walkTree is treeDigest that also gives every entry to sink, if set.
func walkTree(ctx context.Context, root string, whiteouts bool, sink treeSink) (string, error) {
	h := sha256.New()
	w := treeHasher{h: h, links: map[[2]uint64]string{}, buf: make([]byte, 256<<10), whiteouts: whiteouts, sink: sink}
	fmt.Fprintf(h, "dsec-tree-v1\x00")
	if err := w.walk(ctx, root, "."); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

type treeHasher struct {
	h     hash.Hash
	links map[[2]uint64]string // (dev, ino) of multiply linked files → first path
	buf   []byte
	n     int
	// whiteouts accepts overlay whiteouts (see treeDigest).
	whiteouts bool
	// sink, if set, is given every entry as it is hashed and copies the
	// files' contents (hashing them as it copies): a build reads the
	// tree once.
	sink treeSink
}

// treeSink is what builds a layer from the entries of a tree walk.
type treeSink interface {
	// content copies the regular file at p and returns its SHA-256 (hex)
	// and size.
	content(ctx context.Context, p string, size int64) (sum string, n int64, err error)
	// add adds an entry; its parent was added before it.
	add(e treeEntry) error
}

// treeEntry is one entry of a tree walk, as a treeSink gets it.
type treeEntry struct {
	rel    string // relative to the root, "." for the root
	typ    string // "f", "d", "l" or (whiteouts) "w"
	st     *syscall.Stat_t
	target string // symlink target
	link   string // regular file: the earlier path of a hard link
	xattrs []sys.Xattr
}

// field writes one length-prefixed field.
func (w *treeHasher) field(s string) {
	var n [binary.MaxVarintLen64]byte
	w.h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	io.WriteString(w.h, s)
}

func (w *treeHasher) walk(ctx context.Context, root, rel string) error {
	if w.n++; w.n%1024 == 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	p := filepath.Join(root, rel)
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("hashing source tree: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("hashing source tree: no stat data for %s", rel)
	}
	mode := fi.Mode()
	var typ string
	switch {
	case mode.IsRegular():
		typ = "f"
	case mode.IsDir():
		typ = "d"
	case mode&fs.ModeSymlink != 0:
		typ = "l"
	case w.whiteouts && mode&fs.ModeCharDevice != 0 && st.Rdev == 0:
		typ = "w"
	case mode&fs.ModeDevice != 0:
		return errdefs.New(errdefs.Invalid, api.CodeDeviceNode, "%s is a device node; layers cannot hold device nodes", rel)
	default:
		return errdefs.New(errdefs.Invalid, api.CodeSpecialFile, "%s is a FIFO or socket; layers cannot hold them", rel)
	}
	e := treeEntry{rel: rel, typ: typ, st: st}
	w.field(rel)
	w.field(typ)
	w.field(strconv.FormatUint(uint64(st.Mode&0o7777), 8))
	w.field(strconv.FormatUint(uint64(st.Uid), 10))
	w.field(strconv.FormatUint(uint64(st.Gid), 10))
	switch typ {
	case "f":
		key := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
		if first, ok := w.links[key]; ok {
			w.field("hardlink")
			w.field(first)
			e.link = first
			break
		}
		if st.Nlink > 1 {
			w.links[key] = rel
		}
		sum, n, err := w.hashContent(ctx, p, st.Size)
		if err != nil {
			return err
		}
		w.field("content")
		w.field(strconv.FormatInt(n, 10))
		w.field(sum)
	case "l":
		target, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("hashing source tree: %w", err)
		}
		w.field(target)
		e.target = target
	}
	xs, err := sys.ListXattrs(p)
	if err != nil {
		return fmt.Errorf("hashing source tree: %w", err)
	}
	w.field(strconv.Itoa(len(xs)))
	for _, x := range xs {
		w.field(x.Name)
		w.field(string(x.Value))
	}
	if w.sink != nil {
		e.xattrs = xs
		if err := w.sink.add(e); err != nil {
			return err
		}
	}
	if typ != "d" {
		return nil
	}
	ents, err := os.ReadDir(p) // sorted by name
	if err != nil {
		return fmt.Errorf("hashing source tree: %w", err)
	}
	w.field(strconv.Itoa(len(ents)))
	for _, e := range ents {
		if err := w.walk(ctx, root, path.Join(rel, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func (w *treeHasher) hashContent(ctx context.Context, p string, size int64) (string, int64, error) {
	if w.sink != nil {
		return w.sink.content(ctx, p, size)
	}
	f, err := os.Open(p)
	if err != nil {
		return "", 0, fmt.Errorf("hashing source tree: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, w.buf)
	if err != nil {
		return "", 0, fmt.Errorf("hashing source tree: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
