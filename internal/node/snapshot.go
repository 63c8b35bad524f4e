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
// layer of it and stores its files in the blob store.
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
	defer os.RemoveAll(work)
	tree, out := filepath.Join(work, "tree"), filepath.Join(work, "layer")
	idx, cst, err := sn.CaptureState(ctx, tree, since)
	if err != nil {
		return noderpc.SnapshotReply{}, err
	}
	art, err := layer.BuildState(ctx, tree, out)
	if err != nil {
		return noderpc.SnapshotReply{}, fmt.Errorf("snapshot of sandbox %s: %w", req.ID, err)
	}
	stored, err := a.storeLayer(ctx, art)
	if err != nil {
		return noderpc.SnapshotReply{}, fmt.Errorf("snapshot of sandbox %s: %w", req.ID, err)
	}
	st.index = idx
	return noderpc.SnapshotReply{
		Layer: layerspec.Layer{ID: art.ID(), Manifest: art.Manifest}, Full: since == nil,
		Bytes: stored, Files: cst.Copied, Entries: cst.Entries,
		FrozenMS: float64(cst.Frozen.Microseconds()) / 1000, TotalMS: float64(time.Since(start).Microseconds()) / 1000,
	}, nil
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
