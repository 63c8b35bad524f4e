// Package controlplane manages sandboxes across nodes: it validates and
// places creates, drives each sandbox through its lifecycle state machine
// with durable records in the store, routes commands and file operations
// to the sandbox's node, enforces time to live and per-owner limits, and
// reconciles its records with what nodes really run after restarts.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// Limits are the control plane's defaults and bounds. Zero values take
// the defaults documented on each field.
type Limits struct {
	DefaultTier string // "function"
	// DefaultImages maps a tier to the image used when a create names none.
	DefaultImages   map[string]string
	DefaultTimeoutS int     // 300
	MaxTimeoutS     int     // 86400
	DefaultCPU      float64 // 1
	MaxCPU          float64 // 64
	DefaultMemoryMB int     // 256
	MaxMemoryMB     int     // 65536
	DefaultDiskMB   int     // 256
	MaxDiskMB       int     // 1048576
	// MaxSandboxesPerOwner caps one token's live sandboxes (5000).
	MaxSandboxesPerOwner int
	// CreatesPerSecond and CreateBurst rate-limit creates per token
	// (2000/s, burst 2000).
	CreatesPerSecond float64
	CreateBurst      int
	// Exec defaults and bounds.
	DefaultExecTimeoutS float64 // 60
	MaxExecTimeoutS     float64 // 3600
	DefaultOutputBytes  int     // 4 MiB
	MaxOutputBytes      int     // 64 MiB
	// MaxFileBytes caps one uploaded file (4 GiB).
	MaxFileBytes int64
	// Retention keeps stopped and failed records this long (10 min).
	Retention time.Duration
	// MaxForkCount caps one fork's children (64).
	MaxForkCount int
	// SnapshotRetention keeps a snapshot taken outside a trajectory this
	// long (7 days); one in a trajectory lives as long as it.
	SnapshotRetention time.Duration
}

func (l *Limits) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	deff := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if l.DefaultTier == "" {
		l.DefaultTier = api.TierFunction
	}
	def(&l.DefaultTimeoutS, 300)
	def(&l.MaxTimeoutS, 86400)
	deff(&l.DefaultCPU, 1)
	deff(&l.MaxCPU, 64)
	def(&l.DefaultMemoryMB, 256)
	def(&l.MaxMemoryMB, 65536)
	def(&l.DefaultDiskMB, 256)
	def(&l.MaxDiskMB, 1<<20)
	def(&l.MaxSandboxesPerOwner, 5000)
	deff(&l.CreatesPerSecond, 2000)
	def(&l.CreateBurst, 2000)
	deff(&l.DefaultExecTimeoutS, 60)
	deff(&l.MaxExecTimeoutS, 3600)
	def(&l.DefaultOutputBytes, 4<<20)
	def(&l.MaxOutputBytes, 64<<20)
	def(&l.MaxForkCount, 64)
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = 4 << 30
	}
	if l.Retention == 0 {
		l.Retention = 10 * time.Minute
	}
	if l.SnapshotRetention == 0 {
		l.SnapshotRetention = 7 * 24 * time.Hour
	}
}

// Observer receives measurements (the metrics package implements it).
type Observer interface {
	Created(tier string, d time.Duration, err error)
	Executed(tier string, d time.Duration, err error)
}

type noObserver struct{}

func (noObserver) Created(string, time.Duration, error)  {}
func (noObserver) Executed(string, time.Duration, error) {}

// imageResolver is the subset of the image registry the control plane
// uses: resolving a named image, or composing one from inline layers.
type imageResolver interface {
	Resolve(ctx context.Context, ref string) (image.Resolved, error)
	Compose(ctx context.Context, layers []api.ImageLayer, tiers []string) (image.Resolved, error)
	// LayerPaths and ReadLayerFile read a tests layer (sealed grading).
	LayerPaths(ctx context.Context, id string) (map[string]bool, error)
	ReadLayerFile(ctx context.Context, id, p string, max int64) ([]byte, error)
	// RegisterLayer records a layer a node built and stored, or is
	// uploading (a snapshot's); Stack records an image made of another
	// with layers on top.
	RegisterLayer(ctx context.Context, m layer.Manifest, uploading bool) (store.LayerRecord, error)
	Stack(ctx context.Context, base string, top []api.ImageLayer, tiers []string) (image.Resolved, error)
}

// Options configure a Manager.
type Options struct {
	// Store is the durable state (*store.Store); Nodes the protocol to
	// the nodes (*noderpc.Client).
	Store    stateStore
	Nodes    nodeClient
	Images   imageResolver
	Logger   *slog.Logger
	Limits   Limits
	Observer Observer
	// Trajectories is the trajectory store (*trajectory.Store); nil: no
	// trajectories (creates that ask for one are refused).
	Trajectories trajectoryLog
	// NodeStale is how long a node may miss heartbeats before it is not
	// used for placement (10 s) and before its sandboxes are declared lost
	// (NodeLost, 90 s).
	NodeStale time.Duration
	NodeLost  time.Duration
	// Tick is the period of the TTL and retention sweep (500 ms).
	Tick time.Duration
	// SnapshotSweep is the period of the snapshot and state layer
	// sweep (1 min).
	SnapshotSweep time.Duration
	// Name is this API server's name among the servers; Leases, if set,
	// keeps their leases (*store.Store), so that several servers share
	// the work (leases.go). Without it the server is alone.
	Name   string
	Leases leaseStore
	// LeaseTTL is the store's lease TTL (10 s).
	LeaseTTL time.Duration
	// ReconcileEvery is how often the leader compares every node with
	// the records (1 min), besides when a node appears.
	ReconcileEvery time.Duration
}

// Manager is the control plane. It is safe for concurrent use.
type Manager struct {
	st     stateStore
	nodes  nodeClient
	images imageResolver
	log    *slog.Logger
	lim    Limits
	obs    Observer
	opt    Options

	cache  *cache
	view   *nodeView
	leases *leases
	traj   trajectoryLog
	recs   recordings

	limMu    sync.Mutex // guards following fields
	limiters map[string]*rate.Limiter
	creating map[string]int // owner → creates in flight

	inflightMu sync.Mutex          // guards following fields
	inflight   map[string]struct{} // sandboxes with background work running
	creates    map[string]struct{} // sandboxes this process is creating
	// orphanChecked: node → last look for gone servers' creates.
	orphanChecked map[string]time.Time

	started time.Time

	wg     sync.WaitGroup
	cancel context.CancelFunc
	// stopEnded stops answering nodes' EndedReports.
	stopEnded func()
	// sem bounds background destroys (expiry, retries).
	sem chan struct{}
}

// New returns a manager; Start loads state and starts background work.
func New(opt Options) *Manager {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Observer == nil {
		opt.Observer = noObserver{}
	}
	if opt.NodeStale == 0 {
		opt.NodeStale = 10 * time.Second
	}
	if opt.NodeLost == 0 {
		opt.NodeLost = 90 * time.Second
	}
	if opt.Tick == 0 {
		opt.Tick = 500 * time.Millisecond
	}
	if opt.SnapshotSweep == 0 {
		opt.SnapshotSweep = time.Minute
	}
	if opt.LeaseTTL == 0 {
		opt.LeaseTTL = 10 * time.Second
	}
	if opt.ReconcileEvery == 0 {
		opt.ReconcileEvery = time.Minute
	}
	opt.Limits.setDefaults()
	return &Manager{
		st: opt.Store, nodes: opt.Nodes, images: opt.Images,
		log: opt.Logger.With("component", "controlplane"), lim: opt.Limits, obs: opt.Observer, opt: opt,
		traj:          opt.Trajectories,
		recs:          recordings{m: map[string]*recording{}, ending: map[string]chan struct{}{}},
		cache:         newCache(),
		view:          newNodeView(),
		leases:        newLeases(opt.Leases, opt.Name, opt.LeaseTTL),
		limiters:      map[string]*rate.Limiter{},
		creating:      map[string]int{},
		inflight:      map[string]struct{}{},
		creates:       map[string]struct{}{},
		orphanChecked: map[string]time.Time{},
		started:       time.Now(),
		sem:           make(chan struct{}, 64),
	}
}

// Start loads every record, begins watching for changes, and starts the
// node view, the reaper and the reconciler. It returns once the records
// are loaded.
func (m *Manager) Start(ctx context.Context) error {
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	loaded := make(chan struct{})
	var once sync.Once
	err := m.st.WatchSandboxes(bg, m.log, m.cache.has, func(c *store.SandboxChange) {
		if c == nil {
			once.Do(func() { close(loaded) })
			return
		}
		if c.Deleted {
			m.cache.remove(c.Record.ID, c.Revision)
			return
		}
		m.cache.apply(c.Record, c.Revision)
	})
	if err != nil {
		cancel()
		return err
	}
	select {
	case <-loaded:
	case <-ctx.Done():
		cancel()
		return fmt.Errorf("loading sandbox records: %w", ctx.Err())
	}
	m.refreshNodes(ctx)
	if m.nodes != nil {
		stop, err := m.nodes.ServeEnded(func(r noderpc.EndedReport) error { return m.sandboxEnded(bg, r) })
		if err != nil {
			cancel()
			return err
		}
		m.stopEnded = stop
	}
	if m.opt.Leases != nil {
		// Read before the loops start: a lone or restarted server leads
		// from its first sweep.
		m.leases.renew(ctx, m.log)
		m.wg.Add(1)
		go m.leaseLoop(bg)
	}
	m.wg.Add(3)
	go m.nodeLoop(bg)
	go m.reapLoop(bg)
	go m.snapshotLoop(bg)
	return nil
}

// Stop stops background work. Sandboxes are left as they are.
func (m *Manager) Stop() {
	if m.stopEnded != nil {
		m.stopEnded()
	}
	if m.cancel != nil {
		m.cancel()
	}
	m.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.leases.release(ctx)
}

// Counts returns the number of sandboxes by tier and state (for metrics).
func (m *Manager) Counts() map[[2]string]int { return m.cache.counts() }

// Nodes returns the nodes currently known.
func (m *Manager) Nodes() []api.Node { return m.view.list() }
