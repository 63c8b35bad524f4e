package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// blobPutter is the part of the blob store snapshots use.
type blobPutter interface {
	Stat(ctx context.Context, digest string) (blobstore.Info, error)
	Put(ctx context.Context, digest string, r io.Reader) (blobstore.Info, error)
}

// snapState is what the node knows of a sandbox's snapshots: the index
// of what the last one stored, so that the next stores only what changed.
// It lives in memory: after a restart the next snapshot is a full one.
type snapState struct {
	mu    sync.Mutex // guards following field; held for a whole snapshot
	index *sandbox.StateIndex
}

func (a *Service) snapStateOf(id string) *snapState {
	a.smu.Lock()
	defer a.smu.Unlock()
	if a.snaps == nil {
		a.snaps = map[string]*snapState{}
	}
	st := a.snaps[id]
	if st == nil {
		st = &snapState{}
		a.snaps[id] = st
	}
	return st
}

func (a *Service) forgetSnapshots(id string) {
	a.smu.Lock()
	defer a.smu.Unlock()
	delete(a.snaps, id)
}

// Snapshot stores sandbox req.ID's writable state as a state layer: the
// tier copies what changed since the last snapshot (everything for a
// full one) while it holds the sandbox still, the node builds an EROFS
// layer of it, puts it in its own layer cache and stores its files in
// the blob store (after answering, for a Background snapshot).
func (a *Service) Snapshot(ctx context.Context, req noderpc.SnapshotRequest) (noderpc.SnapshotReply, error) {
	start := time.Now()
	sb, tier, err := a.lookup(req.ID)
	if err != nil {
		return noderpc.SnapshotReply{}, err
	}
	sn, ok := sb.(sandbox.Snapshotter)
	if !ok {
		return noderpc.SnapshotReply{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"snapshots are not supported on the %s tier", tier)
	}
	if a.opt.Blobs == nil {
		return noderpc.SnapshotReply{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"node %s has no blob store to keep snapshots in", a.opt.ID)
	}
	st := a.snapStateOf(req.ID)
	st.mu.Lock()
	defer st.mu.Unlock()
	since := st.index
	if req.Full {
		since = nil
	}
	work, err := a.snapshotScratch()
	if err != nil {
		return noderpc.SnapshotReply{}, err
	}
	keep := false // the background upload removes work once done
	defer func() {
		if !keep {
			_ = os.RemoveAll(work)
		}
	}()
	tree, out := filepath.Join(work, "tree"), filepath.Join(work, "layer")
	idx, cst, err := sn.CaptureState(ctx, tree, since)
	if err != nil {
		return noderpc.SnapshotReply{}, err
	}
	art, err := layer.BuildState(ctx, tree, out)
	if err != nil {
		return noderpc.SnapshotReply{}, fmt.Errorf("snapshot of sandbox %s: %w", req.ID, err)
	}
	reply := noderpc.SnapshotReply{
		Layer: layerspec.Layer{ID: art.ID(), Manifest: art.Manifest}, Full: since == nil,
		Files: cst.Copied, Entries: cst.Entries, FrozenMS: float64(cst.Frozen.Microseconds()) / 1000,
	}
	adopted := a.adopt(ctx, art)
	if req.Background && adopted {
		_ = os.RemoveAll(tree) // the layer is built: only its files are uploaded
		keep = true
		a.storeBackground(req.ID, art, work, st, idx)
	} else {
		if reply.Bytes, err = a.storeLayer(ctx, art); err != nil {
			return noderpc.SnapshotReply{}, fmt.Errorf("snapshot of sandbox %s: %w", req.ID, err)
		}
		reply.Stored = true
	}
	st.index = idx
	reply.TotalMS = float64(time.Since(start).Microseconds()) / 1000
	return reply, nil
}

// layerAdopter is the part of the layer cache that takes in a layer
// built on this node.
type layerAdopter interface {
	Adopt(ctx context.Context, art layer.Artifact) error
}

// adopt puts a snapshot's layer into the node's layer cache: a fork's
// children, started here, then mount it without fetching back what the
// node stores. It reports whether the cache took it; if not, sandboxes
// fetch it from the store, and a Background snapshot stores it before
// answering.
func (a *Service) adopt(ctx context.Context, art layer.Artifact) bool {
	ad, ok := a.opt.Layers.(layerAdopter)
	if !ok {
		return false
	}
	if err := ad.Adopt(ctx, art); err != nil {
		a.log.Warn("keeping a snapshot's layer in the layer cache; it will be fetched", "layer", art.ID(), "err", err)
		return false
	}
	return true
}

// snapshotScratch makes a private scratch directory for one snapshot.
func (a *Service) snapshotScratch() (string, error) {
	dir := a.opt.SnapshotDir
	if dir == "" && a.opt.StateDir != "" {
		dir = filepath.Join(filepath.Dir(a.opt.StateDir), "snapshots")
	}
	if dir == "" {
		dir = os.TempDir()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("making the snapshot directory: %w", err)
	}
	return os.MkdirTemp(dir, "snap-")
}

// storeLayer puts the layer's files in the blob store and returns the
// bytes it did not hold before (the store is content-addressed: a layer
// stored already costs nothing).
func (a *Service) storeLayer(ctx context.Context, art layer.Artifact) (int64, error) {
	var stored int64
	for _, f := range art.Manifest.Files() {
		if _, err := a.opt.Blobs.Stat(ctx, f.Ref.Digest); err == nil {
			continue
		} else if !errors.Is(err, errdefs.NotFound) {
			return 0, fmt.Errorf("checking the blob store for %s: %w", f.Name, err)
		}
		r, err := os.Open(filepath.Join(art.Dir, f.Name))
		if err != nil {
			return 0, err
		}
		_, err = a.opt.Blobs.Put(ctx, f.Ref.Digest, r)
		r.Close()
		if err != nil {
			return 0, fmt.Errorf("storing the layer's %s: %w", f.Name, err)
		}
		stored += f.Ref.Size
	}
	return stored, nil
}
