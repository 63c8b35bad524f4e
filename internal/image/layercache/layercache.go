// Package layercache is a node's cache of image layers. It fetches layer
// files from a blob store into a local directory, mounts each layer once
// per host (a file-backed EROFS mount that every user shares, so the page
// cache is shared too), and stacks read-only views and writable sandbox
// roots on those mounts as overlays. Mounts outlive the process: a Cache
// opened on the same directory after a restart adopts them.
//
// Layout under Options.Dir (<hex> is the hex part of a layer ID):
//
//	files/<hex>/meta.erofs, data.blob, layer.json   cached layer files (read-only)
//	tmp/                                             fetches in progress, evictions; emptied by New
//	mnt/<hex>                                        the layer's one EROFS mount
//	views/<key>                                      a read-only overlay; <key> is the hex SHA-256 of the stack's layer IDs
//	roots/<id>                                       sandbox id's writable overlay
//
// Fetching. A layer missing from files/ is fetched into tmp/ and renamed
// into place once complete, so files/<hex> is either absent or whole.
// When the store is on this host (it has a Path method, like
// blobstore.Local) the files are hard-linked from it, falling back to a
// copy across file systems. Digests are checked either way: while copying,
// or by reading the linked file once. A link shares the store's inode;
// blobs are written once and never modified in place, so the verified file
// is trusted from then on, and deleting the blob from the store does not
// take it away from the cache.
//
// Verification after a restart. New checks every files/ entry cheaply
// (layer.json parses, names the directory's ID, file sizes match) and
// removes entries that fail. Digests are checked lazily, before a
// layer's first mount by this process: hashing a 20 GiB cache at start-up
// would delay the node for minutes, and most layers may never be used
// again. A layer already mounted (adopted) is not re-hashed. A mismatch
// removes the files and fetches them again.
//
// Reference counts. A layer mount is referenced by each mounted view that
// stacks it, each sandbox root, and each holder of a single-layer view.
// Views stay mounted with no holders until GC (the next View of the same
// stack is then free); roots are unmounted by their release. GC unmounts
// what nothing references and evicts cached files, least recently used
// first, while the cache is over its budget. It removes the mount points
// of views and roots; a layer's mount point mnt/<hex> stays as long as its
// files are cached, for the next mount (on the development host's ext4 a
// mkdir and rmdir cost 100-900 µs, more than the mount itself). Mounts found by New are
// adopted with no references: the node service re-acquires what its
// recovered sandboxes use (View and Root take over an existing mount), and
// a GC after that removes the rest.
package layercache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sys"
)

// DefaultBudget is the cache budget when Options.Budget is 0.
const DefaultBudget = 20 << 30

// Layer is a layer to mount: its ID and manifest.
type Layer = layerspec.Layer

// Options configure a Cache.
// IDMap makes sandbox roots show layer files with their in-image owners
// to a sandbox in a user namespace: roots are stacked on id-mapped clones
// of the layer mounts (one per layer, shared by every root, so the page
// cache stays shared). Views are not id-mapped.
type IDMap struct {
	// UsernsFd is an open user namespace whose mapping shifts the ids
	// (sandbox 0 → HostUID …). The caller keeps it open while the cache
	// lives.
	UsernsFd int
	// HostUID and HostGID are what sandbox root maps to: roots' upper and
	// work directories are given to them.
	HostUID, HostGID int
}

type Options struct {
	// Dir holds the cache (see the package documentation for its layout).
	// It must be on a disk file system such as ext4 or xfs: EROFS cannot
	// mount a file that lives on tmpfs ("block device required"). Its path
	// must not contain ',' or ':' (overlay option separators).
	Dir string
	// Store is where layer files come from.
	Store blobstore.Store
	// Budget is the most bytes of cached layer files to keep; 0 means
	// DefaultBudget. Unused layers are evicted past it, least recently used
	// first; layers in use are never evicted, so the cache may exceed it.
	Budget int64
	// IDMap, if set, id-maps sandbox roots (see IDMap).
	IDMap *IDMap
	// Lazy, if set, serves data blobs on demand: a layer with a chunk
	// index is then cached as its metadata and index only, and mounted
	// over the blob file Lazy serves, which fetches the chunks its
	// sandboxes read (see lazy.go). Layers without an index are fetched
	// whole either way.
	Lazy LazyBlobs
	// Profiles, with Lazy, gives layers' access profiles: when a lazily
	// loaded layer is mounted, the chunks its profile lists are fetched
	// ahead of its readers (LazyBlobs.Prefetch).
	Profiles Profiles
	// Logger receives the cache's logs; nil discards them.
	Logger *slog.Logger
}

// Stats counts what the cache holds and has done.
type Stats struct {
	Layers     int   // layers whose files are cached
	Bytes      int64 // bytes of cached layer files
	Mounts     int   // layer (EROFS) mounts
	Views      int   // read-only overlays (views of two or more layers)
	Roots      int   // sandbox roots
	Fetches    int64 // layers fetched from the store
	FetchBytes int64 // bytes fetched (copied or linked) from the store
	Hits       int64 // layer acquisitions served without a fetch
	Evictions  int64 // layers whose files were evicted
}

// pather is the optional part of a blob store on this host: the file that
// holds a blob, to hard-link instead of copying (blobstore.Local has it).
type pather interface {
	Path(digest string) (string, error)
}

// Cache is a node's layer cache. It is safe for concurrent use.
type Cache struct {
	dir    string
	store  blobstore.Store
	paths  pather // nil unless the store is on this host
	budget int64
	idmap  *IDMap
	lazy   LazyBlobs // nil: every layer is fetched whole
	prof   Profiles  // nil: no prefetch
	log    *slog.Logger

	trim chan struct{} // pokes the evictor (buffered, 1)
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the evictor has returned

	fetches, fetchBytes, hits, evictions atomic.Int64

	// evictMu serializes evict. It is taken before mu, never while mu is
	// held.
	evictMu sync.Mutex

	mu sync.Mutex // guards following fields, and the fields of every entry below
	// closed is set by Close; View and Root fail after it.
	closed bool
	layers map[string]*layerEntry // by layer hex
	views  map[string]*viewEntry  // by view key
	roots  map[string]*rootEntry  // by sandbox ID
	// bytes is the sum of size over cached layers.
	bytes int64
}

// flight is one slow operation on an entry (fetch and mount, unmount,
// eviction). Others wait for done and then look again; err is set before
// done is closed.
type flight struct {
	done chan struct{}
	err  error
}

func newFlight() *flight { return &flight{done: make(chan struct{})} }

// layerEntry is a layer the cache knows: cached, mounted, or being
// fetched. Its fields are guarded by Cache.mu.
type layerEntry struct {
	hex      string
	cached   bool // files/<hex> is complete
	verified bool // this process has checked the files' digests
	size     int64
	lastUsed time.Time
	mounted  bool // mnt/<hex> is mounted
	idmapped bool // idmap/<hex>, its id-mapped clone, is mounted
	refs     int  // views, roots and single-layer view holders using the mount
	busy     *flight
}

// viewEntry is a read-only overlay at views/<key>. Fields are guarded by
// Cache.mu.
type viewEntry struct {
	key     string
	mounted bool
	// layers are the layer references the mount holds; nil for a view
	// adopted by New that has not been asked for again.
	layers []*layerEntry
	// options are an adopted mount's superblock options.
	options string
	refs    int
	busy    *flight
}

// rootEntry is a sandbox's writable overlay at roots/<id>. Fields are
// guarded by Cache.mu.
type rootEntry struct {
	id       string
	active   bool          // a Root caller holds it
	busy     bool          // being mounted, adopted or unmounted
	layers   []*layerEntry // references held while active
	options  string        // an adopted mount's superblock options
	detached bool          // its mount left roots/<id> (DetachedRoot)
}

// New opens the cache in opt.Dir, creating it if needed. It adopts the
// mounts it finds there (with no references), removes half-fetched files
// and files/ entries that fail a quick check, and starts the background
// evictor, which Close stops.
func New(ctx context.Context, opt Options) (*Cache, error) {
	if opt.Store == nil {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "layer cache: no store")
	}
	dir, err := filepath.Abs(opt.Dir)
	if err != nil || opt.Dir == "" {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "layer cache: bad directory %q", opt.Dir)
	}
	if strings.ContainsAny(dir, ",:") {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "layer cache directory %q contains ',' or ':'", dir)
	}
	c := &Cache{
		dir:    dir,
		store:  opt.Store,
		budget: opt.Budget,
		idmap:  opt.IDMap,
		lazy:   opt.Lazy,
		prof:   opt.Profiles,
		log:    opt.Logger,
		trim:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		layers: make(map[string]*layerEntry),
		views:  make(map[string]*viewEntry),
		roots:  make(map[string]*rootEntry),
	}
	if c.budget <= 0 {
		c.budget = DefaultBudget
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if p, ok := opt.Store.(pather); ok {
		c.paths = p
	}
	for _, d := range []struct {
		name string
		perm os.FileMode
	}{{"files", 0o700}, {"tmp", 0o700}, {"mnt", 0o755}, {"idmap", 0o755}, {"views", 0o755}, {"roots", 0o755}} {
		if err := os.MkdirAll(filepath.Join(dir, d.name), d.perm); err != nil {
			return nil, c.diskErr(err, "creating layer cache")
		}
	}
	// Views' and roots' mount points come and go with every sandbox; on
	// this host's ext4 a mkdir or rmdir costs 0.1–0.9 ms, several times the
	// overlay mount itself. A tmpfs under them makes that ~µs. (Layer
	// files must stay on disk: EROFS refuses to mount a file on tmpfs.)
	for _, d := range []string{"views", "roots"} {
		if p := filepath.Join(dir, d); !sys.IsTmpfsRoot(p) {
			if err := sys.MountTmpfs("dsec-layers", p, "mode=0755,size=16m"); err != nil && !errors.Is(err, errdefs.ErrNotSupported) {
				return nil, err
			}
		}
	}
	if err := c.recover(ctx); err != nil {
		return nil, err
	}
	go c.evictLoop()
	if c.Stats().Bytes > c.budget {
		c.pokeEvictor()
	}
	return c, nil
}

// Close stops the background evictor and records when each cached layer
// was last used (as its directory's mtime, for LRU order after a
// restart). It leaves every mount in place: a Cache opened on the same
// directory adopts them. View and Root fail after Close; releases still
// work.
func (c *Cache) Close(ctx context.Context) error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	c.mu.Unlock()
	if first {
		close(c.stop)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	used := make(map[string]time.Time)
	for hex, e := range c.layers {
		if e.cached && !e.lastUsed.IsZero() {
			used[hex] = e.lastUsed
		}
	}
	c.mu.Unlock()
	for hex, t := range used {
		// Best effort: a lost time only makes eviction order less exact.
		_ = os.Chtimes(c.filesDir(hex), t, t)
	}
	// The mount-point tmpfs goes once nothing is mounted on it; with views
	// or roots left (a restart), it stays with them.
	for _, d := range []string{"views", "roots"} {
		p := filepath.Join(c.dir, d)
		if ms, err := sys.MountsUnder(p); err == nil && len(ms) == 1 && ms[0] == p && sys.IsTmpfsRoot(p) {
			if err := sys.Unmount(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stats returns the cache's counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	s := Stats{Bytes: c.bytes}
	for _, e := range c.layers {
		if e.cached {
			s.Layers++
		}
		if e.mounted {
			s.Mounts++
		}
	}
	for _, v := range c.views {
		if v.mounted {
			s.Views++
		}
	}
	s.Roots = len(c.roots)
	c.mu.Unlock()
	s.Fetches = c.fetches.Load()
	s.FetchBytes = c.fetchBytes.Load()
	s.Hits = c.hits.Load()
	s.Evictions = c.evictions.Load()
	return s
}

func (c *Cache) filesDir(hex string) string { return filepath.Join(c.dir, "files", hex) }
func (c *Cache) mntDir(hex string) string   { return filepath.Join(c.dir, "mnt", hex) }
func (c *Cache) idmapDir(hex string) string { return filepath.Join(c.dir, "idmap", hex) }
func (c *Cache) viewDir(key string) string  { return filepath.Join(c.dir, "views", key) }
func (c *Cache) rootDir(id string) string   { return filepath.Join(c.dir, "roots", id) }
func (c *Cache) tmpDir() string             { return filepath.Join(c.dir, "tmp") }

// closedErr is returned by View and Root after Close.
func closedErr() error {
	return errdefs.New(errdefs.Unavailable, api.CodeLayerCacheClosed, "the layer cache is closed")
}

// pokeEvictor asks the background evictor to run (it coalesces pokes).
func (c *Cache) pokeEvictor() {
	select {
	case c.trim <- struct{}{}:
	default:
	}
}

// evictLoop evicts cached files past the budget whenever poked, until
// Close.
func (c *Cache) evictLoop() {
	defer close(c.done)
	for {
		select {
		case <-c.stop:
			return
		case <-c.trim:
			if err := c.evict(); err != nil {
				c.log.Warn("evicting layers", "err", err)
			}
		}
	}
}

// errorf wraps err with a short context.
func errorf(err error, format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, err)...)
}
