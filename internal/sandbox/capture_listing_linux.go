package sandbox

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// A capture from a listing (CaptureOptions.Listing): a microVM guest's
// agent lists its upper and streams the files the capture asks for. The
// listing is the guest's word, so it is checked before anything is made
// on the node: every path clean and relative, once, under a listed
// directory; only directories, regular files, symlinks, whiteouts (and
// FIFOs and sockets, skipped as in a local capture); sizes within
// MaxBytes; owners within MaxID. It is then walked in the same order as
// a local capture's walk (each directory before what it holds, names
// sorted), whatever order the guest sent, and the rest (index, changes,
// whiteouts, the layer's tree) is the local capture's.

// Bounds on a listed path (Linux's NAME_MAX and PATH_MAX).
const (
	maxListedName = 255
	maxListedPath = 4095
)

// defaultMaxID bounds listed owners when CaptureOptions.MaxID is 0:
// below it every id is one a layer can hold (-1 is chown's "no change").
const defaultMaxID = 1 << 31

// invalidState is the error of a listing that breaks the rules.
func invalidState(format string, args ...any) error {
	return errdefs.New(errdefs.Internal, api.CodeStateInvalid, "the sandbox's listing of its writable state is not valid: "+format, args...)
}

// load checks c.o.Listing and indexes it as walk indexes a directory.
func (c *capturer) load(ctx context.Context) error {
	maxID := c.o.MaxID
	if maxID == 0 {
		maxID = defaultMaxID
	}
	byPath := make(map[string]*capEntry, len(c.o.Listing))
	children := map[string][]string{}
	var total int64
	for i := range c.o.Listing {
		if i%1024 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		le := &c.o.Listing[i]
		if err := checkListedPath(le.Path); err != nil {
			return err
		}
		if _, dup := byPath[le.Path]; dup {
			return invalidState("%q is listed twice", le.Path)
		}
		if le.UID >= maxID || le.GID >= maxID {
			return invalidState("%q is owned by %d:%d, outside the ids a layer holds (below %d)", le.Path, le.UID, le.GID, maxID)
		}
		e := &capEntry{rel: le.Path}
		e.st = syscall.Stat_t{Mode: le.Mode, Uid: le.UID, Gid: le.GID, Ino: le.Ino, Nlink: le.Nlink, Rdev: le.Rdev,
			Mtim: timespec(le.Mtime), Ctim: timespec(le.Ctime)}
		switch le.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			e.key.opaque = le.Opaque
		case syscall.S_IFREG:
			if le.Size < 0 {
				return invalidState("%q has a negative size", le.Path)
			}
			e.st.Size = le.Size
			if total += le.Size; c.o.MaxBytes > 0 && total > c.o.MaxBytes {
				return errdefs.New(errdefs.TooLarge, api.CodeSnapshotTooLarge,
					"the sandbox's writable state lists more than %d bytes of files", c.o.MaxBytes)
			}
		case syscall.S_IFLNK:
			if le.Target == "" || len(le.Target) > maxListedPath || strings.IndexByte(le.Target, 0) >= 0 {
				return invalidState("symlink %q has no valid target", le.Path)
			}
			e.target = le.Target
			e.st.Size = int64(len(le.Target))
		case syscall.S_IFCHR:
			if !c.o.Overlay || le.Rdev != 0 {
				return invalidState("%q is a device node", le.Path)
			}
		case syscall.S_IFIFO, syscall.S_IFSOCK:
			// Not state a layer can hold: skipped, as a local capture
			// skips them.
			continue
		default:
			return invalidState("%q has file type %#o, which a layer cannot hold", le.Path, le.Mode&syscall.S_IFMT)
		}
		if le.Path == "." && !e.isDir() {
			return invalidState("the top is not a directory")
		}
		e.key = stateKey{mode: e.st.Mode, uid: e.st.Uid, gid: e.st.Gid, size: e.st.Size, mtime: le.Mtime, ctime: le.Ctime,
			ino: e.st.Ino, rdev: e.st.Rdev, opaque: e.key.opaque}
		byPath[le.Path] = e
		if le.Path != "." {
			dir := path.Dir(le.Path)
			children[dir] = append(children[dir], le.Path)
		}
	}
	top := byPath["."]
	if top == nil {
		return invalidState("the top directory is not listed")
	}
	// Every entry's parent is a listed directory (not a symlink: nothing
	// is ever made through one).
	for dir := range children {
		if p := byPath[dir]; p == nil || !p.isDir() {
			return invalidState("%q is listed under %q, which is not a listed directory", children[dir][0], dir)
		}
	}
	// Preorder, names sorted: the order walk makes.
	var visit func(e *capEntry, depth int) error
	visit = func(e *capEntry, depth int) error {
		if depth > maxMarkDepth {
			return invalidState("directories nest deeper than %d", maxMarkDepth)
		}
		c.cur[e.rel] = e
		c.order = append(c.order, e)
		kids := children[e.rel]
		slices.Sort(kids)
		for _, k := range kids {
			if err := visit(byPath[k], depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return visit(top, 0)
}

// timespec is ns since the epoch as a stat time.
func timespec(ns int64) syscall.Timespec {
	t := time.Unix(0, ns)
	return syscall.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// checkListedPath checks that p is "." or a clean relative path of
// valid names.
func checkListedPath(p string) error {
	if p == "." {
		return nil
	}
	if len(p) > maxListedPath || !fs.ValidPath(p) || strings.IndexByte(p, 0) >= 0 {
		return invalidState("%q is not a clean relative path", p)
	}
	for _, name := range strings.Split(p, "/") {
		if len(name) > maxListedName {
			return invalidState("%q has a name longer than %d bytes", p, maxListedName)
		}
	}
	return nil
}

// copyListed copies a listed file's content from in, which must hold
// exactly the listed size.
func (c *capturer) copyListed(out *os.File, in io.Reader, e *capEntry) (int64, error) {
	n, err := io.CopyBuffer(out, io.LimitReader(in, e.st.Size), c.copyBuf)
	if err != nil {
		return n, err
	}
	if n < e.st.Size {
		return n, invalidState("%q gave %d bytes, %d listed", e.rel, n, e.st.Size)
	}
	var one [1]byte
	if m, err := io.ReadFull(in, one[:]); m > 0 {
		return n, invalidState("%q gave more bytes than the %d listed", e.rel, e.st.Size)
	} else if err != io.EOF && err != io.ErrUnexpectedEOF {
		return n, fmt.Errorf("reading %s: %w", e.rel, err)
	}
	return n, nil
}
