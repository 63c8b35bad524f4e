package function

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/wasmopt"
	"github.com/tetratelabs/wazero"
)

const (
	// maxModuleSize bounds the module files the runtime reads.
	maxModuleSize = 64 << 20
	// maxFileEntries bounds the path → digest cache.
	maxFileEntries = 4096
)

type digest [sha256.Size]byte

// module is a compiled module and its pool of ready instances.
type module struct {
	digest   digest
	compiled wazero.CompiledModule
	pool     *pool
	// fixed is the host memory an instance holds for its declarations
	// (tables, element and data segments, globals, imports), counted
	// against a call's memory limit with its linear memory; minMemory is
	// the declared minimum of its linear memory. Both are known before
	// instantiating.
	fixed, minMemory uint64
	// prepared is the memory an instance takes before it runs: fixed and
	// what active data segments write.
	prepared uint64
	// start says whether the module has a start function, which runs at
	// instantiation.
	start    bool
	lastUsed atomic.Int64 // unix nanoseconds
	inflight atomic.Int32 // calls running it
}

func (m *module) close() {
	m.pool.stop()
	_ = m.compiled.Close(context.Background()) // does not fail
}

// fileID identifies a version of a file without reading it.
type fileID struct {
	size, mtime int64
	ino         uint64
}

func fileIDOf(fi fs.FileInfo) fileID {
	return fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano(), ino: inode(fi)}
}

type fileEntry struct {
	id      fileID
	digest  digest
	checked int64 // unix nanoseconds of the last stat
}

type loading struct {
	done chan struct{}
	m    *module
	err  error
}

// moduleCache maps module files to compiled modules. Files are known by
// host path and identified by size, mtime and inode; modules are keyed by
// the SHA-256 of their content, so the same bytes under many names (the
// dsectools multi-call binary) compile once and share one pool. It is safe
// for concurrent use.
type moduleCache struct {
	rt *Runtime

	mu      sync.Mutex // guards following fields
	files   map[string]fileEntry
	mods    map[digest]*module
	loading map[digest]*loading
	closed  bool
}

func newModuleCache(rt *Runtime) *moduleCache {
	return &moduleCache{
		rt:      rt,
		files:   map[string]fileEntry{},
		mods:    map[digest]*module{},
		loading: map[digest]*loading{},
	}
}

// load returns the compiled module in file rel of root; key names the file
// on the host and name in messages. A file whose identity was checked less
// than trust ago is not checked again (images are read-only trees, and a
// stat through os.Root costs a syscall per path element); pass 0 for files
// that may change at any time. The caller must call done on the module
// when its call ends.
//
// Errors: fs.ErrNotExist (unwrapped, for the caller to explain) when there
// is no such file; class Invalid for a file that is not a WASI command;
// TooLarge past maxModuleSize (code module_too_large) or past
// wasmopt.DefaultLimits (code module_limit).
func (c *moduleCache) load(root *os.Root, rel, key, name string, trust time.Duration) (*module, error) {
	now := time.Now().UnixNano()
	if trust > 0 {
		c.mu.Lock()
		if e, ok := c.files[key]; ok && now-e.checked < int64(trust) {
			if m := c.mods[e.digest]; m != nil {
				m.inflight.Add(1)
				c.mu.Unlock()
				m.lastUsed.Store(now)
				return m, nil
			}
		}
		c.mu.Unlock()
	}
	fi, err := root.Stat(rel)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidModule, "%s is not a regular file", name)
	}
	id := fileIDOf(fi)
	c.mu.Lock()
	if e, ok := c.files[key]; ok && e.id == id {
		if m := c.mods[e.digest]; m != nil {
			m.inflight.Add(1)
			e.checked = now
			c.files[key] = e
			c.mu.Unlock()
			m.lastUsed.Store(now)
			return m, nil
		}
	}
	c.mu.Unlock()

	f, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if fi.Size() > maxModuleSize {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeModuleTooLarge, "%s is larger than %d MiB", name, maxModuleSize>>20)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	if len(b) > maxModuleSize {
		return nil, errdefs.New(errdefs.TooLarge, api.CodeModuleTooLarge, "%s is larger than %d MiB", name, maxModuleSize>>20)
	}
	d := digest(sha256.Sum256(b))
	c.mu.Lock()
	if len(c.files) >= maxFileEntries {
		clear(c.files)
	}
	c.files[key] = fileEntry{id: fileIDOf(fi), digest: d, checked: now}
	c.mu.Unlock()
	return c.get(d, b, name)
}

// get returns the module with digest d, compiling b if needed.
func (c *moduleCache) get(d digest, b []byte, name string) (*module, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed()
	}
	if m := c.mods[d]; m != nil {
		m.inflight.Add(1)
		c.mu.Unlock()
		m.lastUsed.Store(time.Now().UnixNano())
		return m, nil
	}
	if l := c.loading[d]; l != nil {
		c.mu.Unlock()
		<-l.done
		if l.err != nil {
			return nil, l.err
		}
		return c.get(d, b, name)
	}
	l := &loading{done: make(chan struct{})}
	c.loading[d] = l
	c.mu.Unlock()

	l.m, l.err = c.compile(d, b, name)

	c.mu.Lock()
	delete(c.loading, d)
	var victims []*module
	if l.err == nil {
		if c.closed {
			l.err = errClosed()
		} else {
			l.m.inflight.Add(1)
			l.m.lastUsed.Store(time.Now().UnixNano())
			c.mods[d] = l.m
			victims = c.evictLocked()
		}
	}
	c.mu.Unlock()
	close(l.done)
	for _, v := range victims {
		v.close()
	}
	if l.err != nil {
		if l.m != nil {
			l.m.close()
		}
		return nil, l.err
	}
	return l.m, nil
}

// done ends a call's use of m.
func (c *moduleCache) done(m *module) { m.inflight.Add(-1) }

func (c *moduleCache) compile(d digest, b []byte, name string) (*module, error) {
	opt, err := wasmopt.MergeData(b)
	if err != nil {
		opt = b // not well-formed: Meter says why
	}
	// Nothing reads a module before Meter has checked its declarations:
	// wazero's decoder allocates what a module declares (a 45-byte module
	// with 4e9 locals is 32 GB) and would take the process down.
	metered, info, err := wasmopt.Meter(opt, wasmopt.DefaultLimits)
	var le *wasmopt.LimitError
	switch {
	case errors.As(err, &le):
		return nil, errdefs.New(errdefs.TooLarge, api.CodeModuleLimit, "%s is too large to run: %v", name, le)
	case err != nil:
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidModule, "%s is not a valid WebAssembly module for this tier: %v", name, err)
	}
	cm, err := c.rt.wz.CompileModule(context.Background(), metered)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidModule, err, "%s is not a valid WebAssembly module", name)
	}
	start, ok := cm.ExportedFunctions()["_start"]
	if !ok || len(start.ParamTypes()) != 0 || len(start.ResultTypes()) != 0 {
		_ = cm.Close(context.Background())
		return nil, errdefs.New(errdefs.Invalid, api.CodeNotACommand, "%s is not a WASI command: it exports no _start function", name)
	}
	c.rt.metrics.compilations.Add(1)
	m := &module{digest: d, compiled: cm, fixed: fixedBytes(info), minMemory: info.MemoryPages * pageSize}
	m.prepared, m.start = m.fixed+info.DataBytes, info.Start
	m.pool = newPool(c.rt, m)
	return m, nil
}

// evictLocked removes least recently used modules past the limit, skipping
// those in use, and returns them for the caller to close.
//
// Preconditions: c.mu must be held.
func (c *moduleCache) evictLocked() []*module {
	var out []*module
	for len(c.mods) > c.rt.opts.MaxModules {
		var victim *module
		for _, m := range c.mods {
			if m.inflight.Load() == 0 && (victim == nil || m.lastUsed.Load() < victim.lastUsed.Load()) {
				victim = m
			}
		}
		if victim == nil {
			break
		}
		delete(c.mods, victim.digest)
		out = append(out, victim)
	}
	return out
}

// close stops every pool and releases every compiled module.
func (c *moduleCache) close() {
	c.mu.Lock()
	c.closed = true
	mods := c.mods
	c.mods = map[digest]*module{}
	c.mu.Unlock()
	for _, m := range mods {
		m.close()
	}
}

// isNotExist reports whether err means a missing file, including a path
// through a file where a directory was expected.
func isNotExist(err error) bool {
	var pe *fs.PathError
	return errors.Is(err, fs.ErrNotExist) || (errors.As(err, &pe) && isNotDir(pe.Err))
}
