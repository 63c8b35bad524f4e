// Package lazyblob serves a layer's data blob (data.blob, the EROFS extra
// device) on demand: as a read-only file on a node-local FUSE mount whose
// reads fetch the fixed-size chunks they touch from the blob store on
// first use, check each chunk's SHA-256 against the blob's chunk chunks.Index,
// keep it in a chunk cache on the node's disk and serve it from there
// afterwards. An EROFS mount then names that file as its device
// (sys.MountErofs(meta, path, target)); the metadata image stays a local
// file. A sandbox can so start from a layer of which it has read only
// the chunks it touched.
//
// # Why FUSE
//
// The kernel's own on-demand paths for EROFS are missing on DSec's nodes:
// EROFS over fscache needs CONFIG_EROFS_FS_ONDEMAND and cachefiles, and a
// block device served from user space needs ublk or nbd; none is built.
// FUSE is, and a file on FUSE can back a file-backed EROFS mount as long
// as FUSE passthrough is off (a passthrough-capable FUSE mount counts as
// a stacked file system, which file-backed EROFS refuses), so the Server
// disables it.
//
// # The read path
//
// A READ of the blob file at [off, off+n) is split into the chunks it
// covers. For each: if the cache holds it (checked this run), nothing is
// to do; otherwise one fetch runs for it however many readers want it
// (later readers wait for the running one), under a deadline of
// Options.FetchTimeout. A fetch reads the chunk with Source.ReadRange,
// checks its SHA-256, writes it to the cache and marks it there. A chunk
// whose digest is not the index's is never cached nor returned: the read
// fails with EIO, Stats counts it and a warning is logged, and the next
// read fetches it again. A fetch that passes its deadline also fails the
// read with EIO; a reader never waits past the deadline, even for a
// Source that ignores its context. With every chunk in hand, the reply
// is read from the cache file (or, for a chunk that could not be written
// there, from memory).
// With Options.Complete, a blob whose first chunk a reader fetched has
// its other chunks fetched too, in order, one at a time, whenever no
// reader has waited for a fetch for a moment (complete.go): later reads
// find them local, and a blob fetched whole can be read from its cache
// file directly (CompleteFile). Readers' first asks make the blob's
// access profile, handed to Options.OnProfile; Prefetch fetches a profile
// another run recorded ahead of the readers (profile.go).
// The blob file is opened for direct I/O, so the kernel keeps no pages
// of it: the chunks are in the page cache already as the cache file's,
// and what EROFS read as its files'.
//
// # The cache and its crash safety
//
// Options.CacheDir holds, per blob, <hex>.data, a sparse file of the
// blob's size holding the chunks fetched so far at their offsets, and
// <hex>.bitmap, a 24-byte header (magic, blob size, chunk size, chunk
// count) and one bit per chunk: set when the chunk in the data file is
// complete and checked. A chunk is readable from the data file once
// written, and marked only after its data has been synced (fsync, one
// for a group of chunks: see syncBatch), so a crash can leave chunks
// written but not marked (they are fetched again), never marked but not
// written. A
// bitmap that is missing or does not match the index starts the blob's
// cache afresh. Chunks marked by an earlier run are checked against their
// digest once before their first use (a mismatch unmarks and refetches
// them), so the cache is trusted only as far as it checks out. A lock
// file (flock) keeps two servers from sharing one CacheDir. Remove leaves
// a blob's cache files for a later Add. With Options.MaxCacheBytes the
// cache is kept within a budget (evict_linux.go): the files of blobs no
// longer served go first, then clean chunks of served ones (marked, not
// being read, whose blob is not whole), least recently used first, by
// clearing the mark and then punching the chunk's hole in the data file.
//
// # Locking
//
// Server.mu guards the set of served blobs, each one's name and count of
// open files, and the closed flag; go-fuse's own locks are taken under it
// (adding and removing names), never the other way round. blob.mu guards
// the blob's fetches in flight, its closed flag, whether its completer
// was started and when a reader last waited; an eviction of one of its
// chunks holds it, so that no fetch of the chunk starts meanwhile.
// chunkCache.mu guards the chunks' states, last uses and pins, the
// bitmap and the writes of the bitmap file. Server.evicting is held by
// the one eviction that runs, taken before any of the others. The
// order is Server.mu, then blob.mu, then chunkCache.mu; no lock is held
// while a chunk is fetched, hashed or written. chunks.Index values are not
// changed once built or parsed.
//
// # Lifetime
//
// The kernel sends every read of a blob file to the Server's process: if
// it exits, reads through the EROFS mounts over its files that miss
// their page cache fail (the FUSE connection is gone) until they are
// mounted again over a new Server. Close takes the FUSE mount away even while EROFS mounts
// use it (the same failure, on purpose); Mount detaches the dead mount a
// crashed server left. The Server runs on Linux only; elsewhere Mount
// fails with an error wrapping errdefs.ErrNotSupported.
package lazyblob

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
)

// ReadaheadKB is the readahead, in KiB, for an EROFS mount over a blob
// file (sys.MountErofsReadahead): a chunk, the most one FUSE read
// carries. With the kernel's default of 128 KiB every MiB read was eight
// round trips to this process; measured through a layer whose chunks
// are cached: 0.45 of a local layer's throughput at 128 KiB, 0.66 at
// 1 MiB.
const ReadaheadKB = 1024

// DefaultFetchTimeout bounds one chunk's fetch when Options.FetchTimeout
// is zero.
const DefaultFetchTimeout = 30 * time.Second

// Source reads ranges of blobs; blobstore.Store satisfies it. It is the
// only part of a store the Server needs, so a node can hand it a remote
// store or a wrapper (a test's stalling or corrupting one) alike.
// ReadRange must return once ctx ends.
type Source interface {
	ReadRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error)
}

// Options configure a Server. Dir and CacheDir are required.
type Options struct {
	// Dir is the mount point of the blob files; it is created if needed.
	Dir string
	// CacheDir holds the chunk cache; it is created if needed and must
	// not lie inside Dir.
	CacheDir string
	// FetchTimeout bounds each chunk's fetch from its Source; zero means
	// DefaultFetchTimeout.
	FetchTimeout time.Duration
	// Logger receives warnings (failed and corrupt fetches, a forced
	// unmount) and notes (a dead mount detached); nil discards them.
	Logger *slog.Logger
	// Complete fetches the rest of a blob in the background once a
	// reader has fetched a chunk of it, while reads pause (complete.go).
	Complete bool
	// OnProfile, if set, is handed a blob's access profile (the chunks
	// in the order readers first asked for them) once its readers pause
	// and when it closes (profile.go). It is called from the Server's
	// goroutines, one at a time per blob.
	OnProfile func(digest string, order []int)
	// MaxCacheBytes bounds the chunk cache on disk; 0 means no bound.
	// Past it, the cache files of blobs no longer served go first
	// (oldest first), then chunks of served blobs, least recently used
	// first: only clean ones (synced and marked, not being read, not
	// being fetched), and none of a blob that is whole (its file may be
	// a layer's now: CompleteFile). An evicted chunk is fetched again
	// when next read.
	MaxCacheBytes int64
}

// withDefaults checks o and fills in its defaults. Errors: class Invalid,
// code "invalid_options".
func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" || o.CacheDir == "" {
		return o, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "lazy blobs need a mount directory and a cache directory")
	}
	var err error
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return o, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidOptions, err, "mount directory %s", o.Dir)
	}
	if o.CacheDir, err = filepath.Abs(o.CacheDir); err != nil {
		return o, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidOptions, err, "cache directory %s", o.CacheDir)
	}
	if o.CacheDir == o.Dir || strings.HasPrefix(o.CacheDir, o.Dir+string(filepath.Separator)) {
		return o, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "cache directory %s lies inside the mount directory %s", o.CacheDir, o.Dir)
	}
	if o.MaxCacheBytes < 0 {
		return o, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "chunk cache budget %d is negative", o.MaxCacheBytes)
	}
	if o.FetchTimeout < 0 {
		return o, errdefs.New(errdefs.Invalid, api.CodeInvalidOptions, "fetch timeout %v is negative", o.FetchTimeout)
	}
	if o.FetchTimeout == 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Stats count a Server's chunk traffic since Mount.
type Stats struct {
	// ChunksFetched and BytesFetched count the chunks read from a Source
	// whose digest checked out.
	ChunksFetched int64
	BytesFetched  int64
	// CacheHits counts chunks that reads needed and found in the cache
	// (checked), without waiting for a fetch.
	CacheHits int64
	// FetchFailures counts fetches that failed: the Source's error, a
	// timeout or a digest mismatch. ChunksCorrupt counts the mismatches
	// among them.
	FetchFailures int64
	ChunksCorrupt int64
	// CacheBytes is the chunk cache's size on disk; ChunksEvicted and
	// FilesEvicted count what eviction took to keep it within
	// Options.MaxCacheBytes.
	CacheBytes    int64
	ChunksEvicted int64
	FilesEvicted  int64
}

// counters are Stats as they are counted, shared by a Server's blobs.
type counters struct {
	fetched, bytes, hits, failures, corrupt atomic.Int64
	// cached is the cache files' bytes on disk; evicted and dropped
	// count evicted chunks and removed files; tick orders chunk uses.
	cached, evicted, dropped, tick atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{
		ChunksFetched: c.fetched.Load(),
		BytesFetched:  c.bytes.Load(),
		CacheHits:     c.hits.Load(),
		FetchFailures: c.failures.Load(),
		ChunksCorrupt: c.corrupt.Load(),
		CacheBytes:    c.cached.Load(),
		ChunksEvicted: c.evicted.Load(),
		FilesEvicted:  c.dropped.Load(),
	}
}

// hexOf returns the hex part of a "sha256:<hex>" digest.
func hexOf(digest string) (string, bool) {
	if !layerspec.ValidDigest(digest) {
		return "", false
	}
	return digest[len("sha256:"):], true
}
