package lazyblob

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/internal/sys"
)

// cacheUsage is the bytes on disk of the cache's data files in dir (at
// Mount: the files earlier runs left).
func cacheUsage(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".data") {
			continue
		}
		if b, _, err := sys.AllocatedAt(filepath.Join(dir, e.Name())); err == nil {
			n += b
		}
	}
	return n
}

// cached is each blob's onCached: past the budget, it evicts. One
// eviction runs at a time; a chunk cached meanwhile waits for the next.
func (s *Server) cached() {
	if s.maxCache == 0 || s.stats.cached.Load() <= s.maxCache || !s.evicting.TryLock() {
		return
	}
	defer s.evicting.Unlock()
	over := s.stats.cached.Load() - s.maxCache
	if over <= 0 {
		return
	}
	over -= s.dropFiles(over)
	if over > 0 {
		s.evictChunks(over)
	}
}

// dropFiles removes the cache files of blobs not served, oldest first,
// until over bytes are freed; it returns the bytes freed. (A file a
// layer took whole, hard-linked, keeps its data under the layer's name.)
func (s *Server) dropFiles(over int64) int64 {
	ents, err := os.ReadDir(s.cacheDir)
	if err != nil {
		s.log.Warn("listing the chunk cache", "err", err)
		return 0
	}
	type file struct {
		name  string
		mtime int64
		bytes int64
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var files []file
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".data")
		if !ok || s.blobs[name] != nil {
			continue
		}
		if b, mtime, err := sys.AllocatedAt(filepath.Join(s.cacheDir, e.Name())); err == nil {
			files = append(files, file{name, mtime.UnixNano(), b})
		}
	}
	slices.SortFunc(files, func(a, b file) int { return cmp.Compare(a.mtime, b.mtime) })
	var freed int64
	for _, f := range files {
		if freed >= over {
			break
		}
		base := filepath.Join(s.cacheDir, f.name)
		// The bitmap first: a data file without one starts afresh.
		if err := os.Remove(base + ".bitmap"); err != nil && !os.IsNotExist(err) {
			s.log.Warn("evicting a blob's cached chunks", "blob", f.name, "err", err)
			continue
		}
		if err := os.Remove(base + ".data"); err != nil {
			s.log.Warn("evicting a blob's cached chunks", "blob", f.name, "err", err)
			continue
		}
		s.stats.cached.Add(-f.bytes)
		s.stats.dropped.Add(1)
		freed += f.bytes
	}
	return freed
}

// evictChunks evicts clean chunks of served blobs, least recently used
// first, until over bytes are freed.
func (s *Server) evictChunks(over int64) {
	type cand struct {
		b    *blob
		i    int
		used int64
	}
	s.mu.Lock()
	caches := make([]*blob, 0, len(s.blobs))
	for _, e := range s.blobs {
		caches = append(caches, e.b)
	}
	s.mu.Unlock()
	var cands []cand
	for _, b := range caches {
		// Chunks written but not yet synced are not clean: sync them
		// (their group's time may not have come, and no store after
		// them may come to do it).
		if err := b.cache.sync(); err != nil {
			s.log.Warn("syncing cached chunks before an eviction", "blob", b.idx.Digest, "err", err)
		}
		is, used := b.cache.evictable()
		for k, i := range is {
			cands = append(cands, cand{b, i, used[k]})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(a.used, b.used) })
	var freed int64
	for _, c := range cands {
		if freed >= over {
			return
		}
		n, err := c.b.evict(c.i)
		if err != nil {
			s.log.Warn("evicting a cached chunk", "blob", c.b.idx.Digest, "chunk", c.i, "err", err)
			continue
		}
		if n > 0 {
			s.stats.cached.Add(-n)
			s.stats.evicted.Add(1)
			freed += n
		}
	}
}

// allocated is the bytes on disk of the file at p (0 if there is none).
func allocated(p string) int64 {
	b, _, err := sys.AllocatedAt(p)
	if err != nil {
		return 0
	}
	return b
}
