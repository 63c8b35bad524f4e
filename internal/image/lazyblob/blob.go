package lazyblob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/chunks"
)

// blob serves one blob's chunks: from its cache, or fetched from its
// source once per chunk however many readers want it. It is safe for
// concurrent use.
type blob struct {
	idx     chunks.Index
	src     Source
	cache   *chunkCache
	stats   *counters
	log     *slog.Logger
	timeout time.Duration
	fills   sync.WaitGroup // the fetches running

	// complete, if set, fetches the chunks no reader asked for in the
	// background once reads pause (complete.go).
	complete bool
	// life ends when the blob is closed (kill): fetches and the
	// completer stop then.
	life context.Context
	kill context.CancelFunc

	// onProfile, if set, is handed the blob's access profile (profile.go).
	onProfile func(digest string, order []int)
	// onCached, if set, is called after a chunk was cached (the Server
	// keeps its cache within budget).
	onCached func()

	mu         sync.Mutex // guards following fields
	flights    map[int]*flight
	closed     bool
	completing bool      // the completer has been started
	lastMiss   time.Time // when a reader last waited for a fetch
	// The access profile (profile.go): chunks in the order readers first
	// asked for them, which of them were, when the last was first asked
	// for, how many onProfile was handed, and whether a reporter runs.
	touched   []int
	seen      []bool
	lastTouch time.Time
	reported  int
	reporting bool
}

// flight is one chunk's fetch (or, for a chunk an earlier run cached,
// its check). Its result fields are set before done is closed.
type flight struct {
	done     chan struct{}
	deadline time.Time
	waiters  int    // readers waiting for it; guarded by blob.mu
	fetched  bool   // the chunk came from the source, not the cache
	data     []byte // the checked chunk, only if it could not be cached
	err      error
}

func newBlob(idx chunks.Index, src Source, cache *chunkCache, stats *counters, log *slog.Logger, timeout time.Duration) *blob {
	life, kill := context.WithCancel(context.Background())
	return &blob{idx: idx, src: src, cache: cache, stats: stats, timeout: timeout, flights: map[int]*flight{},
		log: log.With("blob", idx.Digest), life: life, kill: kill}
}

// read reads the bytes [off, off+n) of the blob, n > 0 and within the
// blob, into buf (of at least n bytes) and returns them. Errors: a
// fetch's (class DeadlineExceeded, code "chunk_fetch_timeout", when it
// ran out of time; Internal, "chunk_corrupt", when its digest did not
// match), or ctx's.
func (b *blob) read(ctx context.Context, buf []byte, off, n int64) ([]byte, error) {
	first, last := int(off/int64(b.idx.ChunkSize)), int((off+n-1)/int64(b.idx.ChunkSize))
	// Chunks found in the cache file are read from it below: eviction
	// must not take them in between.
	b.cache.pin(first, last)
	defer b.cache.unpin(first, last)
	var mem map[int][]byte // chunks held in memory only
	for i := first; i <= last; i++ {
		data, err := b.chunk(ctx, i)
		if err != nil {
			return nil, err
		}
		if data != nil {
			if mem == nil {
				mem = map[int][]byte{}
			}
			mem[i] = data
		}
	}
	buf = buf[:n]
	if mem == nil {
		if err := b.cache.readAt(buf, off); err != nil {
			return nil, fmt.Errorf("reading cached chunks: %w", err)
		}
		return buf, nil
	}
	for i := first; i <= last; i++ {
		coff, cn := b.idx.Range(i)
		lo, hi := max(coff, off), min(coff+cn, off+n)
		dst := buf[lo-off : hi-off]
		if data, ok := mem[i]; ok {
			copy(dst, data[lo-coff:hi-coff])
		} else if err := b.cache.readAt(dst, lo); err != nil {
			return nil, fmt.Errorf("reading cached chunk %d: %w", i, err)
		}
	}
	return buf, nil
}

// chunk makes chunk i readable: nil if it is in the cache file, or else
// its bytes. It waits for the chunk's fetch at most until the fetch's
// deadline, even if the source does not return by then.
func (b *blob) chunk(ctx context.Context, i int) ([]byte, error) {
	return b.get(ctx, i, false)
}

// get is chunk; background says the completer asks, which does not
// count as a reader's wait (the completer yields to those).
func (b *blob) get(ctx context.Context, i int, background bool) ([]byte, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errdefs.New(errdefs.Unavailable, api.CodeLazyBlobsClosed, "blob %s is no longer served", b.idx.Digest)
	}
	if !background {
		b.touchLocked(i)
	}
	if b.cache.use(i, b.stats.tick.Add(1)) == chunkVerified {
		b.mu.Unlock()
		b.stats.hits.Add(1)
		return nil, nil
	}
	f := b.flights[i]
	if f == nil {
		f = &flight{done: make(chan struct{}), deadline: time.Now().Add(b.timeout)}
		b.flights[i] = f
		b.fills.Add(1)
		go b.fill(i, f)
	}
	f.waiters++
	if !background {
		b.lastMiss = time.Now()
		b.startCompleterLocked()
	}
	b.mu.Unlock()

	timer := time.NewTimer(time.Until(f.deadline))
	defer timer.Stop()
	select {
	case <-f.done:
	case <-timer.C:
		return nil, b.timeoutErr(i, context.DeadlineExceeded)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if f.err == nil && !f.fetched {
		b.stats.hits.Add(1)
	}
	return f.data, f.err
}

// evict drops chunk i from the cache unless a fetch of it runs (see
// chunkCache.evict); it returns the bytes freed.
func (b *blob) evict(i int) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.flights[i] != nil {
		return 0, nil
	}
	return b.cache.evict(i)
}

// fill runs flight f for chunk i.
func (b *blob) fill(i int, f *flight) {
	defer b.fills.Done()
	ctx, cancel := context.WithDeadline(b.life, f.deadline)
	defer cancel()
	fetched, data, err := b.load(ctx, i)
	b.mu.Lock()
	f.fetched, f.data, f.err = fetched, data, err
	delete(b.flights, i)
	b.mu.Unlock()
	close(f.done)
}

// load gets chunk i into the cache (or memory): a chunk an earlier run
// cached is checked; any other is fetched.
func (b *blob) load(ctx context.Context, i int) (fetched bool, data []byte, err error) {
	rewrite := false // the chunk's blocks are on disk (and counted) already
	if b.cache.chunk(i) == chunkMarked {
		rewrite = true
		ok, err := b.cache.verify(i)
		if err != nil {
			b.log.Warn("checking a cached chunk", "chunk", i, "err", err)
		}
		if ok {
			return false, nil, nil
		}
		b.log.Warn("a cached chunk does not match its digest; fetching it again", "chunk", i)
	}
	data, err = b.fetch(ctx, i)
	if err != nil {
		return true, nil, err
	}
	cached, err := b.cache.store(i, data)
	if err != nil {
		b.log.Warn("caching a chunk", "chunk", i, "err", err)
	}
	if cached {
		if !rewrite {
			b.stats.cached.Add(int64(len(data)))
		}
		if b.onCached != nil {
			b.onCached()
		}
		return true, nil, nil
	}
	return true, data, nil
}

// fetch reads chunk i from the source and checks its digest. A source
// error is tried again, after a pause growing from 50 ms to 1 s, until
// ctx ends (a store that hiccups under load costs a reader time, not an
// EIO); a chunk that does not match its digest, or a blob the store does
// not have, is not.
func (b *blob) fetch(ctx context.Context, i int) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		data, err := b.fetchOnce(ctx, i)
		if err == nil || ctx.Err() != nil || errdefs.CodeOf(err) == api.CodeChunkCorrupt || errors.Is(err, errdefs.NotFound) {
			return data, err
		}
		select {
		case <-ctx.Done():
			return nil, b.timeoutErr(i, err)
		case <-time.After(min(50*time.Millisecond<<attempt, time.Second)):
		}
	}
}

// fetchOnce is one try of fetch.
func (b *blob) fetchOnce(ctx context.Context, i int) ([]byte, error) {
	off, n := b.idx.Range(i)
	data := make([]byte, n)
	rc, err := b.src.ReadRange(ctx, b.idx.Digest, off, n)
	if err == nil {
		_, err = io.ReadFull(blobstore.ContextReader(ctx, rc), data)
		rc.Close()
	}
	if err != nil {
		b.stats.failures.Add(1)
		if ctx.Err() != nil {
			err = b.timeoutErr(i, err)
		} else {
			err = fmt.Errorf("fetching chunk %d of %s: %w", i, b.idx.Digest, err)
		}
		b.log.Warn("fetching a chunk", "chunk", i, "err", err)
		return nil, err
	}
	if got := chunks.Digest(data); got != b.idx.Chunks[i] {
		b.stats.failures.Add(1)
		b.stats.corrupt.Add(1)
		b.log.Warn("a fetched chunk does not match its digest", "chunk", i, "digest", got, "want", b.idx.Chunks[i])
		return nil, errdefs.New(errdefs.Internal, api.CodeChunkCorrupt, "chunk %d of blob %s does not match its digest", i, b.idx.Digest)
	}
	b.stats.fetched.Add(1)
	b.stats.bytes.Add(n)
	return data, nil
}

func (b *blob) timeoutErr(i int, err error) error {
	return errdefs.Wrap(errdefs.DeadlineExceeded, api.CodeChunkFetchTimeout, err,
		"chunk %d of blob %s was not fetched within %v", i, b.idx.Digest, b.timeout)
}

// close stops new fetches and the completer, cancels the fetches running
// (their sources see their context end), waits for them up to the fetch
// timeout (a source that ignores its context is left behind, logged) and
// closes the cache.
func (b *blob) close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.kill()
	done := make(chan struct{})
	go func() {
		b.fills.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(b.timeout):
		b.log.Warn("closing while a chunk fetch runs past its deadline; its source ignores cancellation")
	}
	return b.cache.close()
}
