package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sys"
)

// The writable state, for snapshots (Options.Upper, agentproto.CapState).
// The node asks the agent to freeze the upper's file system (syncfs, then
// FIFREEZE: the guest's processes run on, their writes to it wait), lists
// the upper directory, streams the files that changed and thaws it. The
// node never mounts the guest's disk: a file system the guest wrote is
// only ever parsed by the guest's own kernel. The agent resolves every
// path from its descriptor of the upper, one component at a time and
// without following symlinks, so what a guest process planted there
// cannot lead it elsewhere.

// Overlay's markers in the upper (the guest's overlay is mounted without
// userxattr: trusted.* xattrs).
const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrRedirect = "trusted.overlay.redirect"
	xattrMetacopy = "trusted.overlay.metacopy"
)

// maxStateDepth bounds the listing's recursion.
const maxStateDepth = 2048

// upperState is the agent's handle on the writable layer.
type upperState struct {
	dir  *os.File // the upper directory, as the init handed it
	root *os.Root // the same directory, for no-escape lookups

	mu      sync.Mutex  // guards following fields
	frozen  bool        // the file system is frozen by this agent
	timer   *time.Timer // thaws it at the freeze's deadline
	expired bool        // the timer thawed it since the last freeze
}

// openUpper takes the upper directory dir over.
func openUpper(dir *os.File) (*upperState, error) {
	fi, err := dir.Stat()
	if err != nil || !fi.IsDir() {
		return nil, errdefs.New(errdefs.Invalid, api.CodeBadRoot, "the writable layer's descriptor is not a directory (%v)", err)
	}
	root, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(int(dir.Fd())))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, api.CodeBadRoot, err, "opening the writable layer")
	}
	return &upperState{dir: dir, root: root}, nil
}

// close thaws the file system if this agent froze it and lets go of it.
func (u *upperState) close() {
	u.mu.Lock()
	if u.frozen {
		u.timer.Stop()
		_ = sys.ThawFS(u.dir)
		u.frozen = false
	}
	u.mu.Unlock()
	u.root.Close()
	u.dir.Close()
}

// withState serves c with the writable layer, or refuses it (an agent
// without Options.Upper: a container's, or a guest whose upper is a
// tmpfs in its memory).
func (a *agent) withState(c *agentproto.Call, serve func(*upperState)) {
	if a.state == nil {
		c.Reply(nil, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"this agent has no writable layer of its own to snapshot (only a microVM guest with an upper disk has one)"))
		return
	}
	serve(a.state)
}

// freeze syncs and freezes the upper's file system until thaw, at most
// args.TimeoutMS (agentproto.MaxFreeze): then the agent thaws it itself
// and the next thaw says so.
func (u *upperState) freeze(c *agentproto.Call, args agentproto.FreezeArgs) {
	limit := agentproto.MaxFreeze
	if d := time.Duration(args.TimeoutMS) * time.Millisecond; d > 0 && d < limit {
		limit = d
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.frozen {
		c.Reply(nil, errdefs.New(errdefs.Unavailable, api.CodeStateFreezeFailed, "the writable layer is frozen already (another snapshot is in progress)"))
		return
	}
	if err := sys.SyncFS(u.dir); err != nil {
		c.Reply(nil, freezeError(err))
		return
	}
	if err := sys.FreezeFS(u.dir); err != nil {
		c.Reply(nil, freezeError(err))
		return
	}
	u.frozen, u.expired = true, false
	u.timer = time.AfterFunc(limit, u.expire)
	c.Reply(struct{}{}, nil)
}

func freezeError(err error) error {
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return errdefs.Wrap(errdefs.Unsupported, api.CodeUnsupportedOnTier, err, "the writable layer's file system cannot be frozen")
	}
	return errdefs.Wrap(errdefs.Unavailable, api.CodeStateFreezeFailed, err, "freezing the writable layer")
}

// expire thaws a freeze that outlived its deadline.
func (u *upperState) expire() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.frozen {
		return
	}
	_ = sys.ThawFS(u.dir)
	u.frozen, u.expired = false, true
}

// thaw ends the freeze; thawing an unfrozen layer does nothing, but
// after a freeze that expired it fails once with state_freeze_expired.
func (u *upperState) thaw() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.frozen {
		if u.expired {
			u.expired = false
			return errdefs.New(errdefs.Unavailable, api.CodeStateFreezeExpired,
				"the writable layer stayed frozen past its limit and the guest thawed it: what was read meanwhile may have changed")
		}
		return nil
	}
	u.timer.Stop()
	if err := sys.ThawFS(u.dir); err != nil {
		return errdefs.Wrap(errdefs.Unavailable, api.CodeStateFreezeFailed, err, "thawing the writable layer")
	}
	u.frozen = false
	return nil
}

// list streams the upper's entries as NDJSON, each directory before what
// it holds, the entries of a directory by name.
func (u *upperState) list(c *agentproto.Call) {
	w := stateLister{c: c, ctx: c.Context()}
	w.enc = json.NewEncoder(&w.buf)
	w.enc.SetEscapeHTML(false)
	err := w.dir(u.root, ".", nil, 0)
	if err == nil {
		err = w.flush()
	}
	if err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(struct{}{}, nil)
}

type stateLister struct {
	c   *agentproto.Call
	ctx context.Context
	buf bytes.Buffer
	enc *json.Encoder
	n   int
}

func (w *stateLister) emit(e agentproto.StateEntry) error {
	if w.n++; w.n > agentproto.MaxStateEntries {
		return errdefs.New(errdefs.TooLarge, api.CodeSnapshotTooLarge, "the writable layer holds more than %d entries", agentproto.MaxStateEntries)
	}
	if w.n%1024 == 0 {
		if err := w.ctx.Err(); err != nil {
			return err
		}
	}
	if err := w.enc.Encode(e); err != nil {
		return err
	}
	if w.buf.Len() >= agentproto.ChunkSize {
		return w.flush()
	}
	return nil
}

func (w *stateLister) flush() error {
	if w.buf.Len() == 0 {
		return nil
	}
	b := bytes.Clone(w.buf.Bytes())
	w.buf.Reset()
	return w.c.Send(agentproto.ChanOut, b)
}

// dir lists directory d (at rel; st is its lstat, nil for the top) and
// what it holds.
func (w *stateLister) dir(d *os.Root, rel string, st *syscall.Stat_t, depth int) error {
	if depth > maxStateDepth {
		return errdefs.New(errdefs.TooLarge, api.CodeSnapshotTooLarge, "the writable layer's directories nest deeper than %d", maxStateDepth)
	}
	f, err := d.Open(".")
	if err != nil {
		return stateErr(rel, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return stateErr(rel, err)
	}
	own := fi.Sys().(*syscall.Stat_t)
	if st != nil && (own.Ino != st.Ino || own.Dev != st.Dev) {
		return stateErr(rel, errors.New("the directory changed while it was listed"))
	}
	e := entryOf(rel, own)
	if err := checkOverlayXattrs(f, rel, &e); err != nil {
		return err
	}
	if err := w.emit(e); err != nil {
		return err
	}
	// Readdir lstats each entry relative to the directory's descriptor.
	infos, err := f.Readdir(-1)
	if err != nil {
		return stateErr(rel, err)
	}
	slices.SortFunc(infos, func(a, b fs.FileInfo) int { return strings.Compare(a.Name(), b.Name()) })
	for _, fi := range infos {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		p := path.Join(rel, fi.Name())
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			sub, err := d.OpenRoot(fi.Name())
			if err != nil {
				return stateErr(p, err)
			}
			err = w.dir(sub, p, st, depth+1)
			sub.Close()
			if err != nil {
				return err
			}
			continue
		case syscall.S_IFLNK:
			e := entryOf(p, st)
			if e.Target, err = d.Readlink(fi.Name()); err != nil {
				return stateErr(p, err)
			}
			if err := w.emit(e); err != nil {
				return err
			}
			continue
		case syscall.S_IFREG:
			// A metacopy file (an upper holding only metadata) cannot be
			// carried: its content is below. Off in the guest's overlay.
			if err := checkFileXattrs(d, fi.Name(), p); err != nil {
				return err
			}
		}
		// Devices, FIFOs and sockets are listed too: the node decides
		// (it keeps whiteouts, skips FIFOs and sockets, refuses devices).
		if err := w.emit(entryOf(p, st)); err != nil {
			return err
		}
	}
	return nil
}

// checkOverlayXattrs marks an opaque directory and refuses a redirected
// one (a rename overlay recorded: snapshots cannot hold it).
func checkOverlayXattrs(f *os.File, rel string, e *agentproto.StateEntry) error {
	v, err := sys.FileXattr(f, xattrOpaque)
	if err != nil {
		return stateErr(rel, err)
	}
	e.Opaque = string(v) == "y"
	if v, err := sys.FileXattr(f, xattrRedirect); err != nil {
		return stateErr(rel, err)
	} else if v != nil {
		return stateErr(rel, fmt.Errorf("it has overlay attribute %s, which snapshots cannot hold", xattrRedirect))
	}
	return nil
}

func checkFileXattrs(d *os.Root, name, rel string) error {
	f, err := d.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return stateErr(rel, err)
	}
	defer f.Close()
	if v, err := sys.FileXattr(f, xattrMetacopy); err != nil {
		return stateErr(rel, err)
	} else if v != nil {
		return stateErr(rel, fmt.Errorf("it has overlay attribute %s, which snapshots cannot hold", xattrMetacopy))
	}
	return nil
}

func entryOf(rel string, st *syscall.Stat_t) agentproto.StateEntry {
	return agentproto.StateEntry{
		Path: rel, Mode: st.Mode, UID: st.Uid, GID: st.Gid, Size: st.Size,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), Ino: st.Ino, Nlink: uint64(st.Nlink), Rdev: st.Rdev,
	}
}

func stateErr(rel string, err error) error {
	var e *errdefs.Error
	if errors.As(err, &e) {
		return err
	}
	return errdefs.Wrap(errdefs.Internal, api.CodeStateInvalid, err, "reading the writable layer at %s", rel)
}

// read streams the regular file at args.Path, up to its size when
// opened.
func (u *upperState) read(c *agentproto.Call, args agentproto.StateReadArgs) {
	f, size, err := u.open(args.Path)
	if err != nil {
		c.Reply(nil, err)
		return
	}
	defer f.Close()
	// A cancelled read answers with the context's error, unwrapped.
	streamFile(c, io.LimitReader(f, size), func(err error) error {
		if c.Context().Err() != nil {
			return err
		}
		return stateErr(args.Path, err)
	})
}

// open opens the regular file at p, a clean relative path, from the
// upper: every directory on the way is checked to be one (lstat, then
// opened and compared), and the file is opened with O_NOFOLLOW.
func (u *upperState) open(p string) (*os.File, int64, error) {
	if p == "." || !fs.ValidPath(p) {
		return nil, 0, errdefs.New(errdefs.Invalid, api.CodeBadRequest, "%q is not a clean relative path", p)
	}
	parts := strings.Split(p, "/")
	cur := u.root
	for i, name := range parts[:len(parts)-1] {
		fi, err := cur.Lstat(name)
		if err != nil {
			return nil, 0, stateErr(p, err)
		}
		if !fi.IsDir() {
			return nil, 0, stateErr(p, fmt.Errorf("%s is not a directory", strings.Join(parts[:i+1], "/")))
		}
		next, err := cur.OpenRoot(name)
		if err != nil {
			return nil, 0, stateErr(p, err)
		}
		if cur != u.root {
			cur.Close()
		}
		cur = next
		if err := sameDir(cur, fi); err != nil {
			cur.Close()
			return nil, 0, stateErr(p, err)
		}
	}
	if cur != u.root {
		defer cur.Close()
	}
	f, err := cur.OpenFile(parts[len(parts)-1], os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, stateErr(p, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, stateErr(p, fmt.Errorf("not a regular file (%v)", err))
	}
	return f, fi.Size(), nil
}

// sameDir checks that the directory r opened is the one lstat saw.
func sameDir(r *os.Root, want fs.FileInfo) error {
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	got, err := f.Stat()
	if err != nil {
		return err
	}
	if !os.SameFile(got, want) {
		return errors.New("a directory on the way changed while it was opened")
	}
	return nil
}
