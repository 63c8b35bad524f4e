package lazyblob

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/sys"
)

// chunkState is what a cache knows of one chunk.
type chunkState uint8

const (
	chunkAbsent   chunkState = iota // not in the data file, as far as is known
	chunkMarked                     // marked by an earlier run, not checked in this one
	chunkVerified                   // in the data file and checked in this run
)

// The bitmap file: magic, blob size (uint64), chunk size and chunk count
// (uint32), little-endian, then one bit per chunk (bit i%8 of byte i/8).
const (
	bitmapMagic  = "DSLZBMP1"
	bitmapHeader = 24
)

// chunkCache is one blob's chunks on disk: the sparse data file and its
// bitmap (see the package doc). Its methods are safe for concurrent use;
// chunks are written by at most one caller each at a time (the blob's
// fetch of it).
type chunkCache struct {
	idx   chunks.Index
	data  *os.File
	marks *os.File

	mu     sync.Mutex // guards following fields and the writes to marks
	state  []chunkState
	bitmap []byte
	closed bool
	// pending are chunks written (and readable) but not yet synced, so
	// not yet marked in the bitmap file; synced is when they last were.
	pending []int
	synced  time.Time
	// used is, per chunk, the Server's tick of its last use (for
	// eviction, least recently used first); pins counts the reads that
	// are reading it from the data file (it is not evicted meanwhile).
	used []int64
	pins []int32
}

// Chunks are synced and marked in groups (one fsync of the data file
// for up to syncBatch chunks, or once syncEvery has passed since the
// last): an fsync per chunk was ~10 % of a cold read. A crash loses only
// the marks of the chunks written since, which are fetched again.
const (
	syncBatch = 32
	syncEvery = 100 * time.Millisecond
)

// openCache opens (or creates) the cache files of idx's blob in dir. Its
// chunks marked in the bitmap start as chunkMarked; a bitmap that is
// missing or is not this index's starts the cache afresh.
func openCache(dir string, idx chunks.Index) (*chunkCache, error) {
	n := chunks.Count(idx.Size, idx.ChunkSize)
	if n > math.MaxUint32 {
		return nil, fmt.Errorf("caching blob %s: %d chunks are too many", idx.Digest, n)
	}
	base := filepath.Join(dir, idx.Hex())
	data, err := os.OpenFile(base+".data", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening chunk cache: %w", err)
	}
	c := &chunkCache{idx: idx, data: data, state: make([]chunkState, n), used: make([]int64, n), pins: make([]int32, n)}
	fi, err := data.Stat()
	if err != nil {
		data.Close()
		return nil, fmt.Errorf("opening chunk cache: %w", err)
	}
	bitmap, ok := readBitmap(base+".bitmap", idx)
	if !ok || fi.Size() != idx.Size {
		if bitmap, err = c.reset(base + ".bitmap"); err != nil {
			data.Close()
			return nil, err
		}
	}
	c.bitmap = bitmap
	for i := range c.state {
		if bitmap[i/8]&(1<<(i%8)) != 0 {
			c.state[i] = chunkMarked
		}
	}
	if c.marks, err = os.OpenFile(base+".bitmap", os.O_RDWR, 0); err != nil {
		data.Close()
		return nil, fmt.Errorf("opening chunk cache: %w", err)
	}
	return c, nil
}

// readBitmap returns the bitmap in path if it is idx's.
func readBitmap(path string, idx chunks.Index) ([]byte, bool) {
	b, err := os.ReadFile(path)
	n := chunks.Count(idx.Size, idx.ChunkSize)
	if err != nil || len(b) != bitmapHeader+(n+7)/8 || !bytes.Equal(b[:8], []byte(bitmapMagic)) ||
		binary.LittleEndian.Uint64(b[8:]) != uint64(idx.Size) ||
		binary.LittleEndian.Uint32(b[16:]) != uint32(idx.ChunkSize) ||
		binary.LittleEndian.Uint32(b[20:]) != uint32(n) {
		return nil, false
	}
	return b[bitmapHeader:], true
}

// reset empties the data file (keeping its size: a sparse file) and
// writes an empty bitmap at path, whole or not at all, after it.
func (c *chunkCache) reset(path string) ([]byte, error) {
	if err := c.data.Truncate(0); err != nil {
		return nil, fmt.Errorf("resetting chunk cache: %w", err)
	}
	if err := c.data.Truncate(c.idx.Size); err != nil {
		return nil, fmt.Errorf("resetting chunk cache: %w", err)
	}
	if err := c.data.Sync(); err != nil {
		return nil, fmt.Errorf("resetting chunk cache: %w", err)
	}
	n := len(c.state)
	b := make([]byte, bitmapHeader+(n+7)/8)
	copy(b, bitmapMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(c.idx.Size))
	binary.LittleEndian.PutUint32(b[16:], uint32(c.idx.ChunkSize))
	binary.LittleEndian.PutUint32(b[20:], uint32(n))
	if err := writeFileAtomic(path, b); err != nil {
		return nil, fmt.Errorf("resetting chunk cache: %w", err)
	}
	return b[bitmapHeader:], nil
}

// writeFileAtomic puts b at path through a synced temporary file and a
// rename, and syncs the directory.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removes it on failure
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// chunk returns chunk i's state.
func (c *chunkCache) chunk(i int) chunkState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state[i]
}

// use records that chunk i is used at tick and returns its state.
func (c *chunkCache) use(i int, tick int64) chunkState {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used[i] = tick
	return c.state[i]
}

// pin keeps chunks first..last from eviction while a read reads them
// from the data file; unpin ends it.
func (c *chunkCache) pin(first, last int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := first; i <= last; i++ {
		c.pins[i]++
	}
}

func (c *chunkCache) unpin(first, last int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := first; i <= last; i++ {
		c.pins[i]--
	}
}

// evictable returns the chunks eviction may take (see evict), with their
// last use; none of a blob whose every chunk is in the data file (it may
// have been handed out whole: CompleteFile).
func (c *chunkCache) evictable() (chunks []int, used []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !slices.Contains(c.state, chunkAbsent) {
		return nil, nil
	}
	for i, st := range c.state {
		if c.cleanLocked(i, st) {
			chunks, used = append(chunks, i), append(used, c.used[i])
		}
	}
	return chunks, used
}

// cleanLocked reports whether chunk i (in state st) may be evicted: in
// the data file and marked (synced), and not being read.
//
// Preconditions: c.mu must be held.
func (c *chunkCache) cleanLocked(i int, st chunkState) bool {
	return (st == chunkVerified || st == chunkMarked) && c.pins[i] == 0 && !slices.Contains(c.pending, i)
}

// evict drops chunk i from the cache if it is still clean and the blob
// still lacks a chunk: its mark is cleared first (a crash in between
// leaves data without a mark, fetched again; a mark whose data is gone
// is caught by the check of marked chunks), then its blocks are freed.
// It returns the bytes freed. The caller holds the blob's mu, so that no
// fetch of the chunk starts meanwhile.
func (c *chunkCache) evict(i int) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.cleanLocked(i, c.state[i]) || !slices.Contains(c.state, chunkAbsent) {
		return 0, nil
	}
	c.state[i] = chunkAbsent
	if err := c.writeMarkLocked(i, false); err != nil {
		return 0, err
	}
	off, n := c.idx.Range(i)
	if err := sys.PunchHole(c.data, off, n); err != nil {
		return 0, fmt.Errorf("evicting chunk %d: %w", i, err)
	}
	return n, nil
}

// store writes chunk i (checked by the caller); it is readable from the
// data file at once, and marked in the bitmap file once synced (with the
// next group: see syncBatch). cached reports that the chunk is in the
// data file and readable there, even if syncing or marking failed (err
// then says so: only the mark is lost).
func (c *chunkCache) store(i int, b []byte) (cached bool, err error) {
	off, _ := c.idx.Range(i)
	if _, err := c.data.WriteAt(b, off); err != nil {
		return false, fmt.Errorf("caching chunk %d: %w", i, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false, fmt.Errorf("caching chunk %d: %w", i, os.ErrClosed)
	}
	c.state[i] = chunkVerified
	c.pending = append(c.pending, i)
	due := len(c.pending) >= syncBatch || time.Since(c.synced) >= syncEvery
	c.mu.Unlock()
	if !due {
		return true, nil
	}
	return true, c.sync()
}

// sync makes the pending chunks durable and then marks them. The fsync
// runs without the lock: readers of other chunks do not wait for it.
func (c *chunkCache) sync() error {
	c.mu.Lock()
	group := c.pending
	c.pending = nil
	c.synced = time.Now()
	c.mu.Unlock()
	if len(group) == 0 {
		return nil
	}
	if err := c.data.Sync(); err != nil {
		return fmt.Errorf("syncing %d cached chunks: %w", len(group), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, i := range group {
		if c.state[i] == chunkVerified { // not unmarked meanwhile
			errs = append(errs, c.writeMarkLocked(i, true))
		}
	}
	return errors.Join(errs...)
}

// verify checks chunk i, marked by an earlier run, against its digest:
// it is then verified, or else unmarked (and false returned).
func (c *chunkCache) verify(i int) (bool, error) {
	off, n := c.idx.Range(i)
	b := make([]byte, n)
	if _, err := c.data.ReadAt(b, off); err != nil {
		return false, errors.Join(fmt.Errorf("checking cached chunk %d: %w", i, err), c.unmark(i))
	}
	if chunks.Digest(b) != c.idx.Chunks[i] {
		return false, c.unmark(i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state[i] = chunkVerified
	return true, nil
}

func (c *chunkCache) unmark(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state[i] = chunkAbsent
	return c.writeMarkLocked(i, false)
}

// writeMarkLocked sets or clears chunk i's bit and writes its byte of
// the bitmap file in place (one byte: it is written whole or not at all).
//
// Preconditions: c.mu must be held.
func (c *chunkCache) writeMarkLocked(i int, set bool) error {
	if set {
		c.bitmap[i/8] |= 1 << (i % 8)
	} else {
		c.bitmap[i/8] &^= 1 << (i % 8)
	}
	if c.closed {
		return nil
	}
	if _, err := c.marks.WriteAt(c.bitmap[i/8:i/8+1], bitmapHeader+int64(i/8)); err != nil {
		return fmt.Errorf("marking chunk %d: %w", i, err)
	}
	return nil
}

// readAt reads cached bytes of the blob.
func (c *chunkCache) readAt(p []byte, off int64) error {
	_, err := c.data.ReadAt(p, off)
	return err
}

// close marks the pending chunks (synced first), syncs the bitmap and
// closes the files.
func (c *chunkCache) close() error {
	serr := c.sync()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	err := c.marks.Sync()
	return errors.Join(serr, err, c.marks.Close(), c.data.Close())
}

// complete reports whether every chunk is in the data file, checked
// (chunks marked by an earlier run are checked now) and synced: the data
// file is then the whole blob, and is never written again.
func (c *chunkCache) complete() bool {
	c.mu.Lock()
	var marked []int
	for i, st := range c.state {
		switch st {
		case chunkAbsent:
			c.mu.Unlock()
			return false
		case chunkMarked:
			marked = append(marked, i)
		}
	}
	c.mu.Unlock()
	for _, i := range marked {
		if ok, err := c.verify(i); !ok || err != nil {
			return false
		}
	}
	return c.sync() == nil
}
