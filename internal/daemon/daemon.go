// Package daemon assembles DSec's long-running roles from their parts:
// `up` (everything on one host over an embedded NATS server), `server`
// (API and control plane) and `node` (node service), the latter two joined
// by an external NATS. Each role is built in stages with a cleanup stack,
// runs until its context ends, then shuts down in order: in-flight
// requests finish, sandboxes are destroyed unless kept, NATS flushes.
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/audit"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/controlplane"
	"github.com/dsec-dev/dsec/internal/httpapi"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/image/lazyblob"
	"github.com/dsec-dev/dsec/internal/image/profiles"
	"github.com/dsec-dev/dsec/internal/metrics"
	"github.com/dsec-dev/dsec/internal/natsbus"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// The snapshot sweep removes state layers through the registry.
var _ controlplane.LayerSweeper = (*image.Registry)(nil)

// Role is what a daemon process runs.
type Role int

const (
	RoleUp Role = iota
	RoleServer
	RoleNode
)

// Build identifies this build.
type Build struct {
	Version string
	Commit  string
}

// AddrFile is written in the data directory with the API's actual
// address once it listens (useful with listen port 0).
const AddrFile = "api.addr"

// Run runs role until ctx ends, then shuts down. ready, if not nil, is
// called once the daemon serves.
func Run(ctx context.Context, role Role, cfg config.Config, build Build, log *slog.Logger, ready func(Info)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("creating data directory: %w", err)
	}
	d := &daemon{cfg: cfg, build: build, log: log, role: role}
	var cu cleanup.Stack
	defer cu.Clean()
	if err := d.start(ctx, &cu); err != nil {
		if ctx.Err() != nil {
			// Stopped while starting (SIGTERM during the first start's
			// guest kernel fetch): what started is undone, as at a stop.
			log.Info("stopped while starting", "err", err)
			return nil
		}
		return err
	}
	if ready != nil {
		ready(d.info)
	}
	<-ctx.Done()
	log.Info("shutting down")
	cu.Clean()
	log.Info("stopped")
	return nil
}

// Info describes a running daemon.
type Info struct {
	APIURL    string
	TokenFile string
	// TokenCreated is set when this start created the token.
	TokenCreated bool
	NATSURL      string
	NodeID       string
	// Monitor is the eBPF monitor's state: "on", "off" or "unavailable:
	// <why>" ("" without the container tier); Guard the cgroup-bpf
	// guard's ("on" or "unavailable: <why>").
	Monitor, Guard string
}

type daemon struct {
	cfg   config.Config
	build Build
	log   *slog.Logger
	role  Role
	info  Info

	nc   *nats.Conn
	st   *store.Store
	node *node.Service
	mgr  *controlplane.Manager
	// rec is the audit recorder (nil without [audit]); the node tells it
	// trajectory steps.
	rec *audit.Recorder
}

func (d *daemon) start(ctx context.Context, cu *cleanup.Stack) error {
	if err := d.startDebug(cu); err != nil {
		return err
	}
	if err := d.startBus(ctx, cu); err != nil {
		return err
	}
	if err := natsbus.WaitJetStream(ctx, d.nc, d.log); err != nil {
		return err
	}
	var st *store.Store
	err := natsbus.Retry(ctx, d.log, "opening the store", func(ctx context.Context) (err error) {
		st, err = store.Open(ctx, d.nc, store.Options{Replicas: d.cfg.NATS.StreamReplicas()})
		return err
	})
	if err != nil {
		return err
	}
	d.st = st
	cu.Add(func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := st.FlushEvents(fctx); err != nil {
			d.log.Warn("flushing events", "err", err)
		}
	})
	blobs, err := d.blobStore(ctx)
	if err != nil {
		return err
	}
	images := image.New(image.Options{Records: st, Blobs: blobs, WorkDir: filepath.Join(d.cfg.DataDir, "build")})
	if d.role != RoleNode {
		// Layers and images are the control plane's: it builds the
		// built-ins (nodes fetch them like any other layer).
		if err := d.installBuiltins(ctx, cu, images); err != nil {
			return err
		}
	}
	switch {
	case d.role == RoleNode && d.cfg.Node.Hollow > 0:
		if err := d.startHollow(ctx, cu); err != nil {
			return err
		}
	case d.role != RoleServer:
		if err := d.startNode(ctx, cu, blobs); err != nil {
			return err
		}
	}
	if d.role != RoleNode {
		if err := d.startServer(ctx, cu, images); err != nil {
			return err
		}
	}
	return nil
}

// blobStore opens where layer files live: by default the NATS object
// store, which every node joined to the control plane reaches through the
// connection it has; "local", a directory that only this host sees (its
// node cache then hard-links layer files instead of copying them).
func (d *daemon) blobStore(ctx context.Context) (blobstore.Store, error) {
	if d.cfg.Images.Blobs == "local" {
		return blobstore.NewLocal(filepath.Join(d.cfg.DataDir, "blobs"))
	}
	var b *blobstore.NATS
	err := natsbus.Retry(ctx, d.log, "opening the blob store", func(ctx context.Context) (err error) {
		b, err = blobstore.NewNATS(ctx, d.nc, d.cfg.NATS.StreamReplicas())
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// startBus starts the embedded NATS server (up) or dials the configured
// one (server, node).
func (d *daemon) startBus(ctx context.Context, cu *cleanup.Stack) error {
	name := fmt.Sprintf("dsec-%s-%s", d.roleName(), d.cfg.Node.ID)
	if d.role == RoleNode && d.cfg.NATS.Clustered() {
		return errors.New("dsec node dials NATS (--nats-url); cluster settings are for dsec server")
	}
	if d.role == RoleServer && d.cfg.NATS.Clustered() {
		name = "dsec-server-" + d.serverName()
	}
	if d.role != RoleUp && !d.cfg.NATS.Clustered() {
		if d.cfg.NATS.URL == "" {
			return errors.New("dsec server and dsec node need a NATS URL (--nats-url or DSEC_NATS_URL)")
		}
		nc, err := natsbus.Dial(ctx, d.cfg.NATS.URL, d.cfg.NATS.Token, name)
		if err != nil {
			return err
		}
		d.nc = nc
		d.info.NATSURL = d.cfg.NATS.URL
		cu.Add(func() { d.drain(nc) })
		return nil
	}
	token := d.cfg.NATS.Token
	if token == "" && d.cfg.NATS.Clustered() {
		return errors.New("a NATS cluster member needs the cluster's token (--nats-token or DSEC_NATS_TOKEN, the same on every member)")
	}
	if token == "" {
		tok, _, err := auth.LoadOrCreateAt(filepath.Join(d.cfg.DataDir, "nats.token"))
		if err != nil {
			return err
		}
		token = tok
	}
	listen := d.cfg.NATS.Listen
	if listen == "none" {
		listen = ""
	}
	srv, err := natsbus.Start(ctx, natsbus.Options{
		StoreDir: filepath.Join(d.cfg.DataDir, "nats"), Listen: listen, Token: token, Logger: d.log,
		Name: d.natsServerName(),
		Cluster: natsbus.Cluster{Name: d.cfg.NATS.ClusterName, Listen: d.cfg.NATS.ClusterListen,
			Routes: d.cfg.NATS.Routes},
	})
	if err != nil {
		return err
	}
	cu.Add(srv.Shutdown)
	d.info.NATSURL = srv.ClientURL()
	nc, err := srv.Connect(name)
	if err != nil {
		return fmt.Errorf("connecting to the embedded NATS server: %w", err)
	}
	d.nc = nc
	cu.Add(func() { d.drain(nc) })
	return nil
}

// serverName is this API server's name among the servers.
func (d *daemon) serverName() string {
	if d.cfg.NATS.ServerName != "" {
		return d.cfg.NATS.ServerName
	}
	return d.cfg.Node.ID
}

// natsServerName names the embedded NATS server: the server's name in a
// cluster (members need distinct names), "dsec" alone.
func (d *daemon) natsServerName() string {
	if d.cfg.NATS.Clustered() {
		return d.serverName()
	}
	return "dsec"
}

// drain flushes what the connection still holds before closing it.
func (d *daemon) drain(nc *nats.Conn) {
	done := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(done) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		nc.Close()
	}
}

func (d *daemon) roleName() string {
	return [...]string{"up", "server", "node"}[d.role]
}

func (d *daemon) startNode(ctx context.Context, cu *cleanup.Stack, blobs blobstore.Store) error {
	idmap, closeIDMap, err := d.idMap()
	if err != nil {
		return err
	}
	cu.Add(closeIDMap)
	lopt := layercache.Options{
		Dir: filepath.Join(d.cfg.DataDir, "layers"), Store: blobs, Budget: d.cfg.Images.LayerCacheBytes, Logger: d.log,
		IDMap: idmap,
	}
	if d.cfg.Images.Lazy {
		var prof *profiles.Store
		err := natsbus.Retry(ctx, d.log, "opening the profile store", func(ctx context.Context) (err error) {
			prof, err = profiles.Open(ctx, d.nc, d.cfg.NATS.StreamReplicas())
			return err
		})
		if err != nil {
			return err
		}
		lazy, err := d.lazyBlobs(ctx, prof)
		if err != nil {
			return err
		}
		// Closed after the layer cache (the stack runs backwards), whose
		// shutdown collection unmounts the layers over it first.
		cu.Add(func() {
			if err := lazy.Close(); err != nil {
				d.log.Warn("closing the lazy blob server", "err", err)
			}
		})
		lopt.Lazy, lopt.Profiles = lazy, prof
	}
	layers, err := layercache.New(ctx, lopt)
	if err != nil {
		return err
	}
	cu.Add(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Mounts in use stay for the next start (kept sandboxes); the rest
		// go now.
		if err := layers.GC(cctx); err != nil {
			d.log.Warn("collecting layers at shutdown", "err", err)
		}
		if err := layers.Close(cctx); err != nil {
			d.log.Warn("closing the layer cache", "err", err)
		}
	})
	reg, closeRuntimes, vmReady, err := d.runtimes(ctx, layers)
	if err != nil {
		return err
	}
	cu.Add(closeRuntimes)
	// No create waits for the guest kernel's fetch: the API opens after it.
	d.waitGuestKernel(ctx, vmReady)
	if err := ctx.Err(); err != nil {
		return err
	}
	nopt := node.Options{
		ID: d.cfg.Node.ID, Registry: reg, Logger: d.log, Version: d.build.Version, MaxSandboxes: d.cfg.Node.MaxSandboxes,
		StateDir: filepath.Join(d.cfg.DataDir, "node", "state"), Layers: layers,
		Monitor: d.info.Monitor, Guard: d.info.Guard,
		Starts: node.StartLimits{Slots: d.cfg.Node.MaxStarts, Queue: d.cfg.Node.StartQueue,
			Wait: time.Duration(d.cfg.Node.StartWaitS) * time.Second},
	}
	if d.rec != nil {
		nopt.Steps = d.rec
	}
	// Snapshots store their layers where layers are fetched from.
	nopt.Blobs = blobs
	agent, err := node.New(nopt)
	if err != nil {
		return err
	}
	if err := agent.Start(ctx, d.nc, d.st); err != nil {
		return err
	}
	d.node = agent
	d.info.NodeID = agent.ID()
	cu.Add(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if d.role == RoleNode && !d.cfg.KeepSandboxes {
			agent.DestroyAll(sctx)
		}
		agent.Stop(sctx, d.st)
	})
	return nil
}

func (d *daemon) startServer(ctx context.Context, cu *cleanup.Stack, images *image.Registry) error {
	token, created, err := auth.LoadOrCreate(d.cfg.DataDir)
	if err != nil {
		return err
	}
	d.info.TokenFile = filepath.Join(d.cfg.DataDir, auth.TokenFile)
	d.info.TokenCreated = created
	lim := d.cfg.Limits
	var m *controlplane.Manager
	met := metrics.New(func() map[[2]string]int {
		if m == nil {
			return nil
		}
		return m.Counts()
	})
	defaults := map[string]string{wire.TierFunction: BuiltinFunctionImage, wire.TierContainer: BuiltinContainerImage, wire.TierMicroVM: BuiltinContainerImage, wire.TierVM: BuiltinContainerImage}
	for k, v := range lim.DefaultImages {
		defaults[k] = v
	}
	trajs, err := d.openTrajectories(ctx)
	if err != nil {
		return err
	}
	// Last (the stack unwinds in reverse): after the manager stopped
	// appending, the heads' counters are written out.
	cu.Add(func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := trajs.Close(fctx); err != nil {
			d.log.Warn("closing the trajectory store", "err", err)
		}
	})
	m = controlplane.New(controlplane.Options{
		Store: d.st, Nodes: noderpc.NewClient(d.nc), Images: images, Logger: d.log, Observer: met,
		Limits: controlplane.Limits{
			DefaultImages: defaults, DefaultTimeoutS: lim.DefaultTimeoutS, MaxTimeoutS: lim.MaxTimeoutS,
			DefaultMemoryMB: lim.DefaultMemoryMB, DefaultDiskMB: lim.DefaultDiskMB,
			MaxSandboxesPerOwner: lim.MaxSandboxesPerToken, CreatesPerSecond: lim.CreatesPerSecond,
			CreateBurst: lim.CreateBurst, DefaultOutputBytes: lim.DefaultOutputBytes,
			MaxFileBytes: d.cfg.API.MaxFileBytes, Retention: lim.Retention.Duration,
			MaxForkCount: d.cfg.Trajectories.MaxForkCount, SnapshotRetention: d.cfg.Trajectories.Retention.Duration,
		},
		Trajectories: trajs,
		NodeLost:     lim.NodeLost.Duration,
		Name:         d.serverName(),
		Leases:       d.st,
	})
	if err := m.Start(ctx); err != nil {
		return err
	}
	d.mgr = m
	cu.Add(m.Stop)
	if d.role == RoleUp && !d.cfg.KeepSandboxes {
		// Runs after the API has stopped taking requests (the stack
		// unwinds in reverse) and before the node service stops.
		cu.Add(func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			m.DestroyAll(sctx, d.node.ID(), "shutdown")
		})
	}
	allowDir := d.role == RoleUp
	if d.cfg.API.AllowDirImages != nil {
		allowDir = *d.cfg.API.AllowDirImages
	}
	srv := httpapi.New(httpapi.Options{
		Manager: m, Images: images, Auth: auth.NewChecker(token), Metrics: met, Logger: d.log,
		Version:      wire.VersionInfo{Version: d.build.Version, Commit: d.build.Commit, GoVersion: runtime.Version(), API: wire.Version},
		MaxBodyBytes: d.cfg.API.MaxBodyBytes, MaxFileBytes: d.cfg.API.MaxFileBytes, AllowDirImages: allowDir,
	})
	ln, err := net.Listen("tcp", d.cfg.API.Listen)
	if err != nil {
		return fmt.Errorf("API listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("API server", "err", err)
		}
	}()
	addr := ln.Addr().String()
	d.info.APIURL = "http://" + addr
	addrFile := filepath.Join(d.cfg.DataDir, AddrFile)
	if err := os.WriteFile(addrFile, []byte(addr+"\n"), 0o644); err != nil {
		hs.Close()
		return fmt.Errorf("writing %s: %w", addrFile, err)
	}
	cu.Add(func() {
		os.Remove(addrFile)
		grace := d.cfg.API.ShutdownGrace.Duration
		if grace == 0 {
			grace = 30 * time.Second
		}
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			d.log.Warn("API shutdown: closing remaining connections", "err", err)
			hs.Close()
		}
		<-served
	})
	return nil
}

// lazyBlobs mounts the node's server of data blobs loaded on demand: its
// FUSE files under node/lazy, its chunk cache in chunks/ (on disk, beside
// the layer cache). The access profiles its readers make are merged into
// prof, for every node's prefetch.
func (d *daemon) lazyBlobs(ctx context.Context, prof *profiles.Store) (*lazyblob.Server, error) {
	return lazyblob.Mount(ctx, lazyblob.Options{
		Dir:           filepath.Join(d.cfg.DataDir, "node", "lazy"),
		CacheDir:      filepath.Join(d.cfg.DataDir, "chunks"),
		FetchTimeout:  time.Duration(d.cfg.Images.LazyFetchTimeoutS) * time.Second,
		Complete:      true, // the rest of a layer streams in while its sandboxes pause
		MaxCacheBytes: cmp.Or(d.cfg.Images.ChunkCacheBytes, layercache.DefaultBudget),
		Logger:        d.log,
		OnProfile: func(digest string, order []int) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := prof.Merge(ctx, digest, order); err != nil {
				d.log.Warn("keeping a layer's access profile", "blob", digest, "err", err)
			}
		},
	})
}
