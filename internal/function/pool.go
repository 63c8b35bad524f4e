package function

import (
	"context"
	"crypto/rand"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
)

// instantiateTimeout bounds an instantiation (a module's start section).
const instantiateTimeout = 10 * time.Second

// maxPooledBytes bounds the memory an instance may take before it runs
// (its declarations and data segments) for its module to be pooled.
// Pooled instances are made before a call, and so before its sandbox's
// memory limit is known; larger ones are made on the call's time, after
// the limit is checked.
const maxPooledBytes = 8 << 20

// pool keeps up to Options.PoolSize instances of one module ready (none
// past maxPooledBytes). A refiller goroutine tops it up after every
// checkout and releases the ready instances when the pool has gone unused
// for Options.PoolIdle. It is safe for concurrent use; stop ends the
// goroutine.
type pool struct {
	rt    *Runtime
	m     *module
	ready chan *instance
	kick  chan struct{}
	quit  chan struct{}
	done  chan struct{}
	used  atomic.Int64 // unix nanoseconds of the last checkout
	// broken is set when the refiller failed to instantiate; it stops
	// refilling until an instantiation on the call path succeeds.
	broken atomic.Bool
	once   sync.Once
}

func newPool(rt *Runtime, m *module) *pool {
	size := rt.opts.PoolSize
	if m.prepared > maxPooledBytes {
		size = 0
	}
	p := &pool{
		rt:    rt,
		m:     m,
		ready: make(chan *instance, size),
		kick:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if size > 0 {
		go p.run()
	} else {
		close(p.done)
	}
	return p
}

// get checks out an instance: a ready one if there is one, else a new one
// made on the caller's time (and under its ctx). hit says which.
func (p *pool) get(ctx context.Context) (inst *instance, hit bool, err error) {
	p.used.Store(time.Now().UnixNano())
	select {
	case inst = <-p.ready:
		hit = true
	default:
	}
	if !p.broken.Load() {
		p.refill()
	}
	if hit {
		return inst, true, nil
	}
	if inst, err = p.instantiate(ctx); err != nil {
		return nil, false, err
	}
	if p.broken.Swap(false) {
		p.refill()
	}
	return inst, false, nil
}

// refill wakes the refiller.
func (p *pool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *pool) run() {
	defer close(p.done)
	idle := time.NewTicker(p.rt.opts.PoolIdle)
	defer idle.Stop()
	for {
		select {
		case <-p.quit:
			p.drain()
			return
		case <-p.kick:
			p.fill()
		case <-idle.C:
			if time.Since(time.Unix(0, p.used.Load())) >= p.rt.opts.PoolIdle {
				p.drain()
			}
		}
	}
}

// fill instantiates until the pool is full or stopping.
func (p *pool) fill() {
	for len(p.ready) < cap(p.ready) {
		inst, err := p.instantiate(p.rt.life)
		if err != nil {
			// Calls will instantiate on their own and report the error.
			if !p.broken.Swap(true) && p.rt.life.Err() == nil {
				p.rt.log.Warn("function pool: instantiating", "module", fmt.Sprintf("%x", p.m.digest[:8]), "err", err)
			}
			return
		}
		select {
		case p.ready <- inst:
		case <-p.quit:
			inst.close()
			return
		}
	}
}

func (p *pool) drain() {
	for {
		select {
		case inst := <-p.ready:
			inst.close()
		default:
			return
		}
	}
}

// stop ends the refiller and closes the ready instances.
func (p *pool) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.done
	p.drain()
}

// instantiate makes an instance whose start function has not run. ctx
// bounds a start section, if the module has one.
func (p *pool) instantiate(ctx context.Context) (*instance, error) {
	inst := newInstance()
	fsc := wazero.NewFSConfig().(sysfs.FSConfig).WithSysFSMount(&inst.root, "/")
	fsc = fsc.(sysfs.FSConfig).WithSysFSMount(&inst.work, FileRoot)
	cfg := p.rt.baseConfig().
		WithStdin(&inst.stdin).
		WithStdout(&inst.stdout).
		WithStderr(&inst.stderr).
		WithFSConfig(fsc).
		WithNanosleep(inst.sleep.sleep)
	ctx, cancel := context.WithTimeout(ctx, instantiateTimeout)
	defer cancel()
	ctx = experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(func(_, max uint64) experimental.LinearMemory {
		inst.mem = p.rt.mem.allocate(max)
		return inst.mem
	}))
	mod, err := p.rt.wz.InstantiateModule(ctx, p.m.compiled, cfg)
	if err != nil {
		return nil, err
	}
	p.rt.metrics.instantiations.Add(1)
	p.rt.metrics.live.Add(1)
	inst.mod, inst.live = mod, &p.rt.metrics.live
	if inst.start = mod.ExportedFunction("_start"); inst.start == nil {
		inst.close()
		return nil, fmt.Errorf("module %x has no _start", p.m.digest[:8])
	}
	var ok bool
	if inst.acct, ok = newAccount(mod); !ok {
		inst.close()
		return nil, fmt.Errorf("module %x is not metered", p.m.digest[:8])
	}
	return inst, nil
}

var baseConfig = sync.OnceValue(func() wazero.ModuleConfig {
	return wazero.NewModuleConfig().
		WithName(""). // anonymous: instances of a module may coexist
		WithStartFunctions().
		WithSysWalltime().
		WithSysNanotime().
		WithOsyield(runtime.Gosched).
		WithRandSource(rand.Reader)
})

func (r *Runtime) baseConfig() wazero.ModuleConfig { return baseConfig() }
