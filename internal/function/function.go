// Package function is the function tier: sandboxes whose commands are WASI
// modules run by wazero. Each command runs in a fresh module instance, so
// no memory or process state survives a call; the sandbox keeps only its
// size-capped /workspace directory, which the files API reads and writes.
// The image is visible read-only at / and nothing else of the host is.
//
// A call does not wait for compilation or instantiation: compiled modules
// are cached by content digest (in memory, and on disk through wazero's
// compilation cache), and a pool per module keeps instances ready,
// instantiated in the background with WithStartFunctions() and bound to a
// call when it is checked out (see pool.go and wasi.go).
package function

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/tetratelabs/wazero"
	"golang.org/x/sys/cpu"
)

// Tier is the tier's name.
const Tier = api.TierFunction

// FileRoot is the directory the files API is confined to: the
// sandbox's workspace, mounted at the working directory every tier shares
// (sandbox.Workdir).
const FileRoot = sandbox.Workdir

// Options configure a Runtime. Zero values are valid defaults.
type Options struct {
	// StateDir holds sandboxes (sandboxes/<id>/) and the compilation cache.
	// Default: <os.TempDir()>/dsec-function.
	StateDir string
	// CacheDir holds wazero's compilation cache. Default: <StateDir>/cache.
	// Runtimes may share it.
	CacheDir string
	// Logger receives warnings and background errors. Default: discard.
	Logger *slog.Logger
	// Audit, if set, records what modules do to the workspace: every
	// write, delete and rename, allowed or refused by the phase.
	Audit auditor
	// PoolSize is the number of instances kept ready per module. Default 2;
	// negative disables pooling (every call instantiates).
	PoolSize int
	// PoolIdle is how long a module's pool may go unused before its ready
	// instances are released. Default one minute.
	PoolIdle time.Duration
	// MaxModules bounds the compiled modules kept in memory. Default 64.
	MaxModules int
	// MaxCalls bounds the calls running at once on the runtime; more wait
	// (before their timeout starts). Each running call holds a module
	// instance, 2.5 MiB or more for a Go-compiled tool. Default 32 per
	// GOMAXPROCS, at least 64.
	MaxCalls int
}

func (o Options) withDefaults() Options {
	if o.StateDir == "" {
		o.StateDir = filepath.Join(os.TempDir(), "dsec-function")
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(o.StateDir, "cache")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.PoolSize == 0 {
		o.PoolSize = 2
	}
	if o.PoolSize < 0 {
		o.PoolSize = 0
	}
	if o.PoolIdle <= 0 {
		o.PoolIdle = time.Minute
	}
	if o.MaxModules <= 0 {
		o.MaxModules = 64
	}
	if o.MaxCalls <= 0 {
		o.MaxCalls = max(64, 32*runtime.GOMAXPROCS(0))
	}
	return o
}

// maxMemoryPages is the runtime-wide ceiling on a module's memory (4 GiB).
// Sandboxes get their own, lower limit from the memory allocator.
const maxMemoryPages = 65536

// Runtime runs function-tier sandboxes on one node. It is safe for
// concurrent use.
type Runtime struct {
	opts  Options
	log   *slog.Logger
	wz    wazero.Runtime
	cache wazero.CompilationCache
	mem   *memPool
	mods  *moduleCache
	// calls counts calls in progress so that Close can wait for them
	// before freeing the memory they run in.
	calls gate
	// slots holds a token per running call (Options.MaxCalls).
	slots chan struct{}
	// life ends when the runtime closes; sandbox and call contexts derive
	// from it.
	life    context.Context
	stop    context.CancelFunc
	metrics metrics

	warnOnce sync.Once

	mu        sync.Mutex // guards following fields
	sandboxes map[string]*Sandbox
	images    map[string]*image
	closed    bool
}

var _ sandbox.Runtime = (*Runtime)(nil)

type metrics struct {
	calls, hits, misses, instantiations, compilations atomic.Uint64
	live                                              atomic.Int64
}

func (m *metrics) count(hit bool) {
	m.calls.Add(1)
	if hit {
		m.hits.Add(1)
	} else {
		m.misses.Add(1)
	}
}

// Metrics are counters of a runtime's work since New.
type Metrics struct {
	// Calls is the number of commands run.
	Calls uint64
	// PoolHits counts calls that found an instance ready; PoolMisses those
	// that had to instantiate one on the call path.
	PoolHits, PoolMisses uint64
	// Instantiations counts module instances made, pooled or not.
	Instantiations uint64
	// Compilations counts modules compiled (or loaded from the disk cache).
	Compilations uint64
	// Instances counts module instances alive: ready in pools, or serving
	// calls.
	Instances int64
}

// New returns a runtime over opts.StateDir.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	opts = opts.withDefaults()
	for _, d := range []string{opts.StateDir, filepath.Join(opts.StateDir, "sandboxes"), opts.CacheDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
	}
	if _, err := mountStateFS(filepath.Join(opts.StateDir, "sandboxes")); err != nil {
		return nil, err
	}
	cache, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
	if err != nil {
		return nil, fmt.Errorf("opening compilation cache %s: %w", opts.CacheDir, err)
	}
	cfg := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(maxMemoryPages).
		WithCompilationCache(cache)
	wz := wazero.NewRuntimeWithConfig(ctx, cfg)
	if err := instantiateWASI(ctx, wz); err != nil {
		wz.Close(ctx)
		cache.Close(ctx)
		return nil, fmt.Errorf("instantiating WASI: %w", err)
	}
	life, stop := context.WithCancel(context.Background())
	r := &Runtime{
		opts:      opts,
		log:       opts.Logger,
		wz:        wz,
		cache:     cache,
		mem:       newMemPool(),
		slots:     make(chan struct{}, opts.MaxCalls),
		life:      life,
		stop:      stop,
		sandboxes: map[string]*Sandbox{},
		images:    map[string]*image{},
	}
	r.mods = newModuleCache(r)
	return r, nil
}

// Tier implements sandbox.Runtime.
func (r *Runtime) Tier() string { return Tier }

// Capabilities implements sandbox.Runtime: no shell, no background
// processes, no terminals; files live under /workspace.
func (r *Runtime) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{FileRoot: FileRoot}
}

// Fingerprint implements sandbox.Runtime. The tier runs anywhere wazero
// does; without its compiler (an unsupported architecture) it falls back to
// the slower interpreter and says so in Reason.
func (r *Runtime) Fingerprint(ctx context.Context) api.TierInfo {
	info := api.TierInfo{Name: Tier, Available: true, Accelerator: "none"}
	if !compilerSupported() {
		info.Reason = fmt.Sprintf("wazero has no compiler for %s/%s: using the interpreter", runtime.GOOS, runtime.GOARCH)
	}
	return info
}

// compilerSupported mirrors wazero's choice between its compiler and its
// interpreter (internal/platform.CompilerSupported).
func compilerSupported() bool {
	switch runtime.GOOS {
	case "linux", "darwin", "freebsd", "netbsd", "windows", "dragonfly", "solaris", "illumos":
	default:
		return false
	}
	switch runtime.GOARCH {
	case "arm64":
		return runtime.GOOS != "dragonfly" && runtime.GOOS != "solaris" && runtime.GOOS != "illumos"
	case "amd64":
		return cpu.X86.HasSSE41
	}
	return false
}

// Metrics returns the runtime's counters.
func (r *Runtime) Metrics() Metrics {
	return Metrics{
		Calls:          r.metrics.calls.Load(),
		PoolHits:       r.metrics.hits.Load(),
		PoolMisses:     r.metrics.misses.Load(),
		Instantiations: r.metrics.instantiations.Load(),
		Compilations:   r.metrics.compilations.Load(),
		Instances:      r.metrics.live.Load(),
	}
}

// Close implements sandbox.Runtime. It stops calls in progress, waits for
// them, and releases compiled modules, pools and memory. Sandboxes stay on
// disk (their workspaces stay mounted) for a later Recover; the Sandbox
// values of this runtime stop working.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	sbs := make([]*Sandbox, 0, len(r.sandboxes))
	for _, sb := range r.sandboxes {
		sbs = append(sbs, sb)
	}
	imgs := r.images
	r.sandboxes, r.images = nil, nil
	r.mu.Unlock()

	r.stop() // cancels every call
	select {
	case <-r.calls.close():
	case <-ctx.Done():
		// Freeing memory under a running guest would corrupt it; keep
		// waiting, since cancelled calls end promptly.
		r.log.Warn("function runtime: waiting for calls to stop", "err", ctx.Err())
		<-r.calls.close()
	}
	r.mods.close()
	for _, sb := range sbs {
		sb.release()
	}
	for _, img := range imgs {
		img.root.Close()
	}
	err := r.wz.Close(context.Background())
	if e := r.cache.Close(context.Background()); err == nil {
		err = e
	}
	r.mem.close()
	if e := unmountStateFS(filepath.Join(r.opts.StateDir, "sandboxes")); err == nil {
		err = e
	}
	return err
}

// errClosed is returned by operations on a closed runtime.
func errClosed() error {
	return errdefs.New(errdefs.Unavailable, api.CodeRuntimeClosed, "the function runtime is shutting down")
}
