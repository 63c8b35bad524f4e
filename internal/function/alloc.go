package function

import (
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// Linear memories live in regions reserved once at their maximum size
// (4 GiB for most modules) without committing memory, so growing never
// copies; freed regions are kept for the next instance. A region with a
// large dirty prefix is handed back to the kernel when it is freed; a small
// one is cleared when it is next taken, which happens while the pool
// instantiates ahead of calls, rather than when it is freed, which happens
// at the end of a call (proc_exit) and would add to its latency. Where
// reserving is not possible (no mmap, or the kernel refuses), memories fall
// back to plain Go slices that copy when they grow.

const (
	// releaseThreshold: a dirty prefix larger than this is handed back to
	// the kernel (pages read back as zeros) instead of being cleared.
	releaseThreshold = 16 << 20
	// maxFreeRegions bounds the regions kept for reuse.
	maxFreeRegions = 16
	// pageSize is the WebAssembly page size.
	pageSize = 65536
)

// memPool creates linear memories and recycles their regions. It is safe
// for concurrent use.
type memPool struct {
	mu     sync.Mutex // guards following fields
	free   map[uint64][]region
	nfree  int
	closed bool
}

// region is a free region whose first dirty bytes may hold a previous
// guest's data.
type region struct {
	buf   []byte
	dirty uint64
}

func newMemPool() *memPool {
	return &memPool{free: map[uint64][]region{}}
}

// allocate returns a linear memory that can grow to max bytes.
func (p *memPool) allocate(max uint64) linearMemory {
	size := (max + pageSize - 1) &^ (pageSize - 1)
	if size == 0 {
		size = pageSize
	}
	if buf := p.get(size); buf != nil {
		return &regionMemory{pool: p, buf: buf}
	}
	buf, err := reserve(size)
	if err != nil {
		return &sliceMemory{max: max}
	}
	return &regionMemory{pool: p, buf: buf}
}

// get returns a free region of size bytes, all zeros, or nil.
func (p *memPool) get(size uint64) []byte {
	p.mu.Lock()
	list := p.free[size]
	if len(list) == 0 {
		p.mu.Unlock()
		return nil
	}
	r := list[len(list)-1]
	p.free[size] = list[:len(list)-1]
	p.nfree--
	p.mu.Unlock()
	clear(r.buf[:r.dirty])
	return r.buf
}

// put takes back a region of which the first dirty bytes may be non-zero.
func (p *memPool) put(buf []byte, dirty uint64) {
	if dirty > releaseThreshold {
		if err := release(buf[:dirty]); err != nil {
			unreserve(buf)
			return
		}
		dirty = 0
	}
	p.mu.Lock()
	if p.closed || p.nfree >= maxFreeRegions {
		p.mu.Unlock()
		unreserve(buf)
		return
	}
	size := uint64(len(buf))
	p.free[size] = append(p.free[size], region{buf: buf, dirty: dirty})
	p.nfree++
	p.mu.Unlock()
}

// close unmaps the free regions; regions freed later are unmapped then.
func (p *memPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for size, list := range p.free {
		for _, r := range list {
			unreserve(r.buf)
		}
		delete(p.free, size)
	}
	p.nfree = 0
}

// linearMemory is an experimental.LinearMemory whose growth a call can cap
// and account for.
//
// An instance's memory is touched by one goroutine at a time: the pool's
// refiller while instantiating, then the goroutine running the call.
type linearMemory interface {
	experimental.LinearMemory
	// checkout caps growth at limit bytes, takes growth out of acct's
	// room, and reports the memory's size to usage until Free. It returns
	// false if the memory already exceeds limit.
	checkout(limit uint64, usage *atomic.Int64, acct *account) bool
	// size is the current size in bytes.
	size() uint64
	// refused reports whether a growth past limit was refused since
	// checkout.
	refused() bool
}

// regionMemory is a linear memory in a reserved region.
type regionMemory struct {
	pool  *memPool
	buf   []byte // the whole region
	len   uint64 // current size
	dirty uint64 // bytes possibly written since the region was zeroed
	// limit caps growth once the memory exists; 0 during instantiation
	// means the memory may not grow past its initial size.
	limit   uint64
	started bool
	denied  bool // a growth past limit was refused
	usage   *atomic.Int64
	acct    *account
}

func (m *regionMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.buf)) || (m.started && size > m.len && (size > m.limit || !m.acct.take(size-m.len))) {
		m.denied = m.started
		return nil
	}
	if m.usage != nil {
		m.usage.Add(int64(size) - int64(m.len))
	}
	m.started = true
	m.len = size
	m.dirty = max(m.dirty, size)
	return m.buf[:size:size]
}

func (m *regionMemory) Free() {
	if m.buf == nil {
		return
	}
	if m.usage != nil {
		m.usage.Add(-int64(m.len))
		m.usage = nil
	}
	buf := m.buf
	m.buf = nil
	m.pool.put(buf, m.dirty)
}

func (m *regionMemory) checkout(limit uint64, usage *atomic.Int64, acct *account) bool {
	if m.len > limit {
		return false // and Free must not take the size off usage
	}
	m.limit, m.usage, m.acct, m.denied = limit, usage, acct, false
	if usage != nil {
		usage.Add(int64(m.len))
	}
	return true
}

func (m *regionMemory) size() uint64 { return m.len }

func (m *regionMemory) refused() bool { return m.denied }

// sliceMemory is the fallback linear memory: a Go slice that copies when
// it outgrows its capacity.
type sliceMemory struct {
	buf     []byte
	max     uint64
	limit   uint64
	started bool
	denied  bool // a growth past limit was refused
	usage   *atomic.Int64
	acct    *account
}

func (m *sliceMemory) Reallocate(size uint64) []byte {
	cur := uint64(len(m.buf))
	if size > m.max || (m.started && size > cur && (size > m.limit || !m.acct.take(size-cur))) {
		m.denied = m.started
		return nil
	}
	m.started = true
	if m.usage != nil {
		m.usage.Add(int64(size) - int64(cur))
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	nb := make([]byte, size, min(max(size, 2*uint64(cap(m.buf))), m.max))
	copy(nb, m.buf)
	m.buf = nb
	return m.buf
}

func (m *sliceMemory) Free() {
	if m.usage != nil {
		m.usage.Add(-int64(len(m.buf)))
		m.usage = nil
	}
	m.buf = nil
}

func (m *sliceMemory) checkout(limit uint64, usage *atomic.Int64, acct *account) bool {
	if uint64(len(m.buf)) > limit {
		return false // and Free must not take the size off usage
	}
	m.limit, m.usage, m.acct, m.denied = limit, usage, acct, false
	if usage != nil {
		usage.Add(int64(len(m.buf)))
	}
	return true
}

func (m *sliceMemory) size() uint64 { return uint64(len(m.buf)) }

func (m *sliceMemory) refused() bool { return m.denied }
