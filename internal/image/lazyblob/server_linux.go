package lazyblob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/sys"
)

const (
	// fsName is the FUSE file system's type (fuse.lazyblob) and source.
	fsName = "lazyblob"
	// maxRead is the largest READ the kernel sends (the FUSE maximum).
	maxRead = 1 << 20
	// serveWait bounds Close's wait for the FUSE server to stop once
	// the mount is gone.
	serveWait = 10 * time.Second
)

// Server serves blobs as files on one FUSE mount. It is safe for
// concurrent use.
type Server struct {
	dir, cacheDir string
	timeout       time.Duration
	complete      bool // Options.Complete
	onProfile     func(digest string, order []int)
	log           *slog.Logger
	lock          *os.File // holds the cache directory's flock
	root          *rootNode
	served        chan struct{} // closed when the FUSE server has stopped
	stats         counters

	// maxCache is Options.MaxCacheBytes; evicting is held by the one
	// eviction that runs (evict_linux.go).
	maxCache int64
	evicting sync.Mutex

	mu     sync.Mutex        // guards following fields, and entry's named, opens and gone
	blobs  map[string]*entry // by hex digest
	closed bool
}

// entry is a blob the Server serves or still has open.
type entry struct {
	b *blob
	// named: the blob has its file in Dir. opens: open files of it.
	// gone: it was closed (unnamed and not open). Guarded by Server.mu.
	named bool
	opens int
	gone  bool
}

// pollHackName is the name go-fuse serves its poll-hack file under.
const pollHackName = ".go-fuse-epoll-hack"

// Mount mounts a Server's file system at opt.Dir. A dead mount left
// there by a server that crashed is detached first. Errors: class
// Invalid, code "invalid_options", for bad options; Conflict,
// "lazy_cache_locked", if another server uses opt.CacheDir; an error
// wrapping errdefs.ErrNotSupported if the host has no FUSE or the
// process may not mount.
func Mount(ctx context.Context, opt Options) (*Server, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("mounting lazy blobs: %w: %w", err, errdefs.ErrNotSupported)
	}
	var cu cleanup.Stack
	defer cu.Clean()
	lock, err := lockCacheDir(opt.CacheDir)
	if err != nil {
		return nil, err
	}
	cu.Add(func() { lock.Close() })
	if err := prepareMountPoint(opt.Dir, opt.Logger); err != nil {
		return nil, err
	}
	fd, err := sys.MountFUSEConn(opt.Dir, fsName, "max_read="+strconv.Itoa(maxRead))
	if errors.Is(err, syscall.EPERM) {
		return nil, fmt.Errorf("mounting lazy blobs: %w: %w", err, errdefs.ErrNotSupported)
	}
	if err != nil {
		return nil, fmt.Errorf("mounting lazy blobs: %w", err)
	}
	cu.Add(func() { _, _ = sys.UnmountFUSE(opt.Dir) }) // undoing a failed Mount; its error is the one to report
	s := &Server{dir: opt.Dir, cacheDir: opt.CacheDir, timeout: opt.FetchTimeout, complete: opt.Complete, onProfile: opt.OnProfile, log: opt.Logger, lock: lock,
		root: &rootNode{}, served: make(chan struct{}), blobs: map[string]*entry{}, maxCache: opt.MaxCacheBytes}
	s.stats.cached.Store(cacheUsage(opt.CacheDir))
	entryTimeout, attrTimeout := time.Duration(0), time.Hour // names come and go; a file's attributes never change
	fsys := fs.NewNodeFS(s.root, &fs.Options{
		EntryTimeout:    &entryTimeout,
		NegativeTimeout: &entryTimeout,
		AttrTimeout:     &attrTimeout,
	})
	// go-fuse owns fd from here, and closes it if it fails.
	srv, err := fuse.NewServer(fsys, "/dev/fd/"+strconv.Itoa(fd), &fuse.MountOptions{
		Name:     fsName,
		FsName:   fsName,
		MaxWrite: maxRead,
		// Splicing replies measured no faster here, and go-fuse's splice
		// opens /dev/null without close-on-exec.
		DisableSplice: true,
		// A FUSE mount that may pass files through counts as stacked,
		// and file-backed EROFS refuses to mount a file on it.
		DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		Logger:               slog.NewLogLogger(opt.Logger.Handler(), slog.LevelWarn),
	})
	if err != nil {
		return nil, fmt.Errorf("mounting lazy blobs: starting FUSE: %w", err)
	}
	go func() {
		srv.Serve()
		close(s.served)
	}()
	if err := srv.WaitMount(); err != nil {
		return nil, fmt.Errorf("mounting lazy blobs: %w", err) // the unmount above stops Serve
	}
	// go-fuse answers its "poll hack" file's first POLL with "not
	// implemented" (see sys.PollFUSEOnce); mounted through a descriptor
	// it does not ask for one itself. Without it, this process opening a
	// blob file (a test; QEMU is another process) could hang in epoll_ctl.
	if err := sys.PollFUSEOnce(opt.Dir, pollHackName); err != nil {
		return nil, fmt.Errorf("mounting lazy blobs: %w", err)
	}
	cu.Release()
	return s, nil
}

// lockCacheDir creates dir and takes its lock file's flock.
func lockCacheDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating chunk cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking chunk cache: %w", err)
	}
	if err := sys.TryLock(f); err != nil {
		f.Close()
		if errors.Is(err, sys.ErrLocked) {
			return nil, errdefs.Wrap(errdefs.Conflict, api.CodeLazyCacheLocked, err, "chunk cache %s is in use by another server", dir)
		}
		return nil, fmt.Errorf("locking chunk cache: %w", err)
	}
	return f, nil
}

// prepareMountPoint creates dir, detaching a dead FUSE mount a crashed
// server left there, and fails if something else is mounted there.
func prepareMountPoint(dir string, log *slog.Logger) error {
	_, err := os.Stat(dir)
	if errors.Is(err, syscall.ENOTCONN) {
		log.Info("detaching the dead mount of a crashed server", "dir", dir)
		if err := sys.DetachMount(dir); err != nil {
			return fmt.Errorf("mounting lazy blobs: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mounting lazy blobs: %w", err)
	}
	mounts, err := sys.MountsUnder(dir)
	if err != nil {
		return fmt.Errorf("mounting lazy blobs: %w", err)
	}
	if slices.Contains(mounts, dir) {
		return fmt.Errorf("mounting lazy blobs: %s is a mount point already", dir)
	}
	return nil
}

// Add serves the blob idx describes, read from src, as a read-only file
// named by its hex digest in the mount directory, and returns the file's
// path. Adding a blob served already returns its path (src is then not
// used). Errors: class Invalid, code "invalid_chunk_index", for a bad
// index; Conflict, "lazy_blob_exists", if the blob is served with
// another index; Unavailable, "lazy_blobs_closed", after Close.
func (s *Server) Add(ctx context.Context, idx chunks.Index, src Source) (string, error) {
	if err := idx.Validate(); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	name := idx.Hex()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errdefs.New(errdefs.Unavailable, api.CodeLazyBlobsClosed, "the lazy blob server is closed")
	}
	e := s.blobs[name]
	switch {
	case e != nil && !e.b.idx.Equal(idx):
		return "", errdefs.New(errdefs.Conflict, api.CodeLazyBlobExists, "blob %s is served with another chunk index", idx.Digest)
	case e != nil && e.named:
		return filepath.Join(s.dir, name), nil
	case e == nil:
		before := allocated(filepath.Join(s.cacheDir, name+".data"))
		cache, err := openCache(s.cacheDir, idx)
		if err != nil {
			return "", err
		}
		// A cache that did not match the index started afresh.
		if after, err := sys.Allocated(cache.data); err == nil {
			s.stats.cached.Add(after - before)
		}
		e = &entry{b: newBlob(idx, src, cache, &s.stats, s.log, s.timeout)}
		e.b.complete, e.b.onProfile, e.b.onCached = s.complete, s.onProfile, s.cached
		s.blobs[name] = e
	}
	// New, or removed but still open (then named again). A new inode
	// each time: one removed may still be open, and stays valid for its
	// openers.
	ino := s.root.NewPersistentInode(ctx, &fileNode{s: s, e: e}, fs.StableAttr{Mode: syscall.S_IFREG})
	s.root.AddChild(name, ino, true)
	e.named = true
	return filepath.Join(s.dir, name), nil
}

// Remove stops serving the blob named by digest ("sha256:<hex>"): its
// file leaves the mount directory at once; files of it still open (an
// EROFS mount over it) are served until they are closed, and then its
// cache files are closed. They stay on disk for a later Add. Removing a
// blob not served is not an error.
func (s *Server) Remove(ctx context.Context, digest string) error {
	name, ok := hexOf(digest)
	if !ok {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidDigest, "digest %q is not sha256:<64 hex digits>", digest)
	}
	s.mu.Lock()
	e := s.blobs[name]
	if e == nil || !e.named {
		s.mu.Unlock()
		return nil
	}
	s.root.RmChild(name)
	e.named = false
	drop := s.dropLocked(name, e)
	s.mu.Unlock()
	if drop {
		return e.b.close()
	}
	return nil
}

// dropLocked forgets e, named name, once it is neither named nor open;
// it reports whether it did (the caller then closes e.b).
//
// Preconditions: s.mu must be held.
func (s *Server) dropLocked(name string, e *entry) bool {
	if e.named || e.opens > 0 || e.gone {
		return false
	}
	e.gone = true
	delete(s.blobs, name)
	return true
}

// CompleteFile returns the chunk cache's data file of the blob named by
// digest if the blob is served and every chunk of it is cached, checked
// and synced: the file is then the whole blob, which a new mount may
// read directly instead of through FUSE. The Server never writes it
// again.
func (s *Server) CompleteFile(digest string) (string, bool) {
	name, ok := hexOf(digest)
	if !ok {
		return "", false
	}
	s.mu.Lock()
	e := s.blobs[name]
	s.mu.Unlock()
	if e == nil || !e.b.cache.complete() {
		return "", false
	}
	return e.b.cache.data.Name(), true
}

// Prefetch fetches the chunks order lists of the blob named by digest,
// if it is served, in the background ahead of its readers (an access
// profile an earlier run recorded; see Options.OnProfile). Chunks cached
// already, and indexes out of range, are skipped.
func (s *Server) Prefetch(digest string, order []int) {
	if e := s.entryOf(digest); e != nil {
		e.b.prefetch(order)
	}
}

// Profile returns the access profile so far of the blob named by digest
// if it is served.
func (s *Server) Profile(digest string) ([]int, bool) {
	e := s.entryOf(digest)
	if e == nil {
		return nil, false
	}
	return e.b.profile(), true
}

// entryOf returns the entry of the blob named by digest, or nil.
func (s *Server) entryOf(digest string) *entry {
	name, ok := hexOf(digest)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blobs[name]
}

// Stats returns the chunk counters since Mount.
func (s *Server) Stats() Stats { return s.stats.snapshot() }

// Dir returns the mount directory.
func (s *Server) Dir() string { return s.dir }

// Close unmounts the file system and closes every blob's cache. The
// EROFS mounts over its files should be unmounted first: if one is still
// mounted, Close forces the unmount, which aborts the FUSE connection
// (reads through that EROFS mount then fail), and logs a warning. No
// mount is left behind either way.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()

	forced, err := sys.UnmountFUSE(s.dir)
	if forced {
		s.log.Warn("lazy blob files were still in use; the FUSE mount was forced off", "dir", s.dir)
	}
	if err == nil {
		select {
		case <-s.served:
		case <-time.After(serveWait):
			err = fmt.Errorf("closing lazy blobs: the FUSE server did not stop within %v of the unmount", serveWait)
		}
	}
	if err != nil {
		// The server may still read the caches: leave them open, and
		// locked.
		return err
	}

	s.mu.Lock()
	var blobs []*blob
	for name, e := range s.blobs {
		e.named, e.opens = false, 0
		if s.dropLocked(name, e) {
			blobs = append(blobs, e.b)
		}
	}
	s.mu.Unlock()
	for _, b := range blobs {
		err = errors.Join(err, b.close())
	}
	return errors.Join(err, s.lock.Close())
}

// opened counts an open file of e; it reports false if e is gone.
func (s *Server) opened(e *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.gone || s.closed {
		return false
	}
	e.opens++
	return true
}

// released counts a closed file of e, and closes e's blob if that was
// the last file and e has no name.
func (s *Server) released(e *entry) {
	s.mu.Lock()
	if e.opens > 0 {
		e.opens--
	}
	drop := s.dropLocked(e.b.idx.Hex(), e)
	s.mu.Unlock()
	if drop {
		if err := e.b.close(); err != nil {
			s.log.Warn("closing a removed blob's cache", "blob", e.b.idx.Digest, "err", err)
		}
	}
}
