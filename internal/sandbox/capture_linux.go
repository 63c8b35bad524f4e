package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// Overlay's markers in an upper directory (the node mounts overlays
// without userxattr, so they are trusted.* xattrs).
const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrOverlay  = "trusted.overlay."
	xattrRedirect = "trusted.overlay.redirect"
	xattrMetacopy = "trusted.overlay.metacopy"
	overflowID    = 65534
)

type capEntry struct {
	rel    string // "." for the top
	st     syscall.Stat_t
	key    stateKey
	target string // a listed symlink's (Listing)
}

func (e *capEntry) isDir() bool { return e.st.Mode&syscall.S_IFMT == syscall.S_IFDIR }

func isWhiteout(st *syscall.Stat_t) bool {
	return st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == 0
}

type capturer struct {
	ctx     context.Context
	o       CaptureOptions
	cur     map[string]*capEntry
	order   []*capEntry // preorder
	made    map[string]bool
	dirs    []*capEntry // dirs made in Dst, in the order made
	links   map[uint64]string
	stats   CaptureStats
	copyBuf []byte
}

func captureState(ctx context.Context, o CaptureOptions) (*StateIndex, CaptureStats, error) {
	c := &capturer{ctx: ctx, o: o, cur: map[string]*capEntry{}, made: map[string]bool{}, links: map[uint64]string{}, copyBuf: make([]byte, 1<<20)}
	if o.Listing != nil {
		if o.Read == nil {
			return nil, c.stats, errors.New("capturing the writable state: a listing without a reader")
		}
		if err := c.load(ctx); err != nil {
			return nil, c.stats, err
		}
	} else if err := c.walk(ctx, ".", 0); err != nil {
		return nil, c.stats, err
	}
	c.stats.Entries = len(c.order) - 1
	if err := c.copy(ctx); err != nil {
		return nil, c.stats, err
	}
	idx := &StateIndex{entries: make(map[string]stateKey, len(c.cur))}
	for rel, e := range c.cur {
		idx.entries[rel] = e.key
	}
	return idx, c.stats, nil
}

// src is rel's path in Src ("/." for the top, which may be a magic link
// of /proc/self/fd: the directory, not the link, is meant).
func (c *capturer) src(rel string) string {
	if rel == "." {
		return c.o.Src + "/."
	}
	return filepath.Join(c.o.Src, rel)
}
func (c *capturer) dst(rel string) string { return filepath.Join(c.o.Dst, c.o.Prefix, rel) }

// walk indexes rel and, for a directory, what it holds.
func (c *capturer) walk(ctx context.Context, rel string, depth int) error {
	if depth > maxMarkDepth {
		return fmt.Errorf("capturing the writable state: directories nest deeper than %d", maxMarkDepth)
	}
	if len(c.order)%1024 == 1023 {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	p := c.src(rel)
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("capturing the writable state: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("capturing the writable state: no stat data for %s", rel)
	}
	e := &capEntry{rel: rel, st: *st}
	e.key = stateKey{mode: st.Mode, uid: st.Uid, gid: st.Gid, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino, rdev: st.Rdev}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR, syscall.S_IFREG, syscall.S_IFLNK:
	case syscall.S_IFCHR:
		if !c.o.Overlay || !isWhiteout(st) {
			return fmt.Errorf("capturing the writable state: %s is a device node", rel)
		}
	default:
		// FIFOs and sockets are not state a layer can hold; a sandbox
		// that made one gets it back empty-handed (it is skipped).
		return nil
	}
	if c.o.Overlay && (e.isDir() || st.Mode&syscall.S_IFMT == syscall.S_IFREG) {
		xs, err := sys.ListXattrs(p)
		if err != nil {
			return fmt.Errorf("capturing the writable state: %w", err)
		}
		for _, x := range xs {
			switch {
			case x.Name == xattrOpaque && string(x.Value) == "y":
				e.key.opaque = e.isDir()
			case x.Name == xattrRedirect || x.Name == xattrMetacopy:
				// Off on this node's overlays; a layer could not say it.
				return fmt.Errorf("capturing the writable state: %s has overlay attribute %s, which snapshots cannot hold", rel, x.Name)
			}
		}
	}
	c.cur[rel] = e
	c.order = append(c.order, e)
	if !e.isDir() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("capturing the writable state: %w", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("capturing the writable state: %w", err)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := c.walk(ctx, path.Join(rel, n), depth+1); err != nil {
			return err
		}
	}
	return nil
}

// copy makes the layer's tree: changed entries (every one without
// Since), the directories above them, whole opaque directories that
// changed, and whiteouts for entries removed since.
func (c *capturer) copy(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(c.o.Dst, c.o.Prefix), 0o755); err != nil {
		return err
	}
	var since map[string]stateKey
	if c.o.Since != nil {
		since = c.o.Since.entries
	}
	var forced []string // opaque directories copied whole (a stack: preorder)
	for i, e := range c.order {
		if i%1024 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		for len(forced) > 0 && !under(e.rel, forced[len(forced)-1]) {
			forced = forced[:len(forced)-1]
		}
		old, had := since[e.rel]
		if since != nil && had && old == e.key && len(forced) == 0 && e.rel != "." {
			continue
		}
		if err := c.put(e); err != nil {
			return err
		}
		if e.key.opaque {
			forced = append(forced, e.rel)
		}
	}
	// Entries gone since: a whiteout for each topmost one (in a
	// directory that is still there and not copied whole).
	var gone []string
	for rel := range since {
		if _, ok := c.cur[rel]; !ok {
			gone = append(gone, rel)
		}
	}
	slices.Sort(gone)
	for _, rel := range gone {
		parent := c.cur[path.Dir(rel)]
		if parent == nil || !parent.isDir() || c.opaqueCopied(parent.rel) {
			continue
		}
		if err := c.parents(rel); err != nil {
			return err
		}
		if err := sys.Mknod(c.dst(rel), syscall.S_IFCHR, 0, 0); err != nil {
			return err
		}
		c.stats.Copied++
		c.stats.Whiteouts++
	}
	// Directory times last: making their entries changed them.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		e := c.dirs[i]
		t := time.Unix(e.st.Mtim.Sec, e.st.Mtim.Nsec)
		if err := os.Chtimes(c.dst(e.rel), t, t); err != nil {
			return err
		}
	}
	return nil
}

// opaqueCopied reports whether rel, or a directory above it, was copied
// whole as an opaque directory.
func (c *capturer) opaqueCopied(rel string) bool {
	for {
		if e := c.cur[rel]; e != nil && e.key.opaque && c.made[rel] {
			return true
		}
		if rel == "." {
			return false
		}
		rel = path.Dir(rel)
	}
}

func under(rel, dir string) bool {
	return dir == "." || rel == dir || strings.HasPrefix(rel, dir+"/")
}

// parents makes the directories above rel in Dst, as they are in Src.
func (c *capturer) parents(rel string) error {
	if rel == "." {
		return nil
	}
	dir := path.Dir(rel)
	if c.made[dir] {
		return nil
	}
	if err := c.parents(dir); err != nil {
		return err
	}
	e := c.cur[dir]
	if e == nil {
		return fmt.Errorf("capturing the writable state: %s is gone", dir)
	}
	return c.makeDir(e, false)
}

// put copies entry e.
func (c *capturer) put(e *capEntry) error {
	if err := c.parents(e.rel); err != nil {
		return err
	}
	d := c.dst(e.rel)
	switch e.st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		if c.made[e.rel] {
			return nil
		}
		return c.makeDir(e, e.key.opaque)
	case syscall.S_IFCHR:
		if err := sys.Mknod(d, syscall.S_IFCHR, 0, 0); err != nil {
			return err
		}
		c.stats.Whiteouts++
	case syscall.S_IFLNK:
		t := e.target
		if c.o.Listing == nil {
			var err error
			if t, err = os.Readlink(c.src(e.rel)); err != nil {
				return fmt.Errorf("capturing the writable state: %w", err)
			}
		}
		if err := os.Symlink(t, d); err != nil {
			return err
		}
		if err := c.own(d, e); err != nil {
			return err
		}
	case syscall.S_IFREG:
		if first, ok := c.links[e.st.Ino]; ok && e.st.Nlink > 1 {
			if err := os.Link(c.dst(first), d); err != nil {
				return err
			}
			c.stats.Copied++
			return nil
		}
		if err := c.copyFile(e, d); err != nil {
			return err
		}
		if e.st.Nlink > 1 {
			c.links[e.st.Ino] = e.rel
		}
	}
	c.stats.Copied++
	return nil
}

func (c *capturer) makeDir(e *capEntry, opaque bool) error {
	d := c.dst(e.rel)
	if err := os.Mkdir(d, 0o700); err != nil && !(e.rel == "." && errors.Is(err, fs.ErrExist)) {
		return err
	}
	c.made[e.rel] = true
	c.dirs = append(c.dirs, e)
	if err := c.meta(d, e); err != nil {
		return err
	}
	if opaque {
		if err := sys.SetXattr(d, xattrOpaque, []byte("y")); err != nil {
			return err
		}
	}
	c.stats.Copied++
	return nil
}

func (c *capturer) copyFile(e *capEntry, d string) error {
	var in io.ReadCloser
	var err error
	if c.o.Listing != nil {
		in, err = c.o.Read(c.ctx, e.rel)
	} else {
		in, err = os.OpenFile(c.src(e.rel), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	}
	if err != nil {
		return fmt.Errorf("capturing the writable state: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(d, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	var n int64
	if c.o.Listing != nil {
		n, err = c.copyListed(out, in, e)
	} else {
		n, err = io.CopyBuffer(out, in, c.copyBuf)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying %s: %w", e.rel, err)
	}
	c.stats.Bytes += n
	if err := c.meta(d, e); err != nil {
		return err
	}
	t := time.Unix(e.st.Mtim.Sec, e.st.Mtim.Nsec)
	return os.Chtimes(d, t, t)
}

// meta gives d e's owner, mode and xattrs (overlay's own aside).
func (c *capturer) meta(d string, e *capEntry) error {
	if err := c.own(d, e); err != nil {
		return err
	}
	// After chown, which clears setuid and setgid.
	if err := os.Chmod(d, fileMode(e.st.Mode)); err != nil {
		return err
	}
	if c.o.Listing != nil {
		return nil // a listing carries no xattrs
	}
	xs, err := sys.ListXattrs(c.src(e.rel))
	if err != nil {
		return fmt.Errorf("capturing the writable state: %w", err)
	}
	for _, x := range xs {
		if strings.HasPrefix(x.Name, xattrOverlay) {
			continue
		}
		if err := sys.SetXattr(d, x.Name, x.Value); err != nil {
			return err
		}
	}
	return nil
}

func (c *capturer) own(d string, e *capEntry) error {
	return os.Lchown(d, int(c.shift(e.st.Uid)), int(c.shift(e.st.Gid)))
}

// shift maps a host id of the state into the layer's ids.
func (c *capturer) shift(id uint32) uint32 {
	if c.o.IDCount == 0 {
		return id
	}
	if id < c.o.IDBase || id-c.o.IDBase >= c.o.IDCount {
		return overflowID
	}
	return id - c.o.IDBase
}

// fileMode is a stat mode's permission bits as an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&syscall.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
