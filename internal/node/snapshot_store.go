package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// storeJob is the upload of a Background snapshot's layer; bytes and err
// are set before done is closed.
type storeJob struct {
	done  chan struct{}
	bytes int64
	err   error
}

// storedKept is how long a finished upload's outcome stays for Stored to
// report; after it, Stored asks the blob store.
const storedKept = 2 * time.Minute

// storeBackground uploads the files of art (built in work, which it
// removes when done) to the blob store. If the upload fails, the
// sandbox's next snapshot is a full one: it must not stand on a layer
// the store does not hold. st is sandbox's snapshot state, idx the index
// this snapshot leaves in it.
func (a *Service) storeBackground(id string, art layer.Artifact, work string, st *snapState, idx *sandbox.StateIndex) {
	job := &storeJob{done: make(chan struct{})}
	key := art.ID()
	a.smu.Lock()
	if a.stores == nil {
		a.stores = map[string]*storeJob{}
	}
	a.stores[key] = job
	a.smu.Unlock()
	bg := a.bg
	if bg == nil {
		bg = context.Background()
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(bg, noderpc.SnapshotTimeout)
		defer cancel()
		job.bytes, job.err = a.storeLayer(ctx, art)
		if err := os.RemoveAll(work); err != nil {
			a.log.Warn("removing a snapshot's scratch files", "dir", work, "err", err)
		}
		if job.err != nil {
			job.err = fmt.Errorf("snapshot of sandbox %s: %w", id, job.err)
			a.log.Warn("storing a snapshot's layer", "sandbox", id, "layer", key, "err", job.err)
			st.mu.Lock()
			if st.index == idx {
				st.index = nil
			}
			st.mu.Unlock()
		}
		close(job.done)
		time.AfterFunc(storedKept, func() {
			a.smu.Lock()
			defer a.smu.Unlock()
			if a.stores[key] == job {
				delete(a.stores, key)
			}
		})
	}()
}

// Stored waits for the upload of a Background snapshot's layer. An
// upload this node no longer remembers is judged by the blob store: the
// layer is stored if it holds every file.
func (a *Service) Stored(ctx context.Context, req noderpc.StoredRequest) (noderpc.StoredReply, error) {
	if a.opt.Blobs == nil {
		return noderpc.StoredReply{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"node %s has no blob store to keep snapshots in", a.opt.ID)
	}
	a.smu.Lock()
	job := a.stores[req.Layer.ID]
	a.smu.Unlock()
	if job == nil {
		for _, f := range req.Layer.Manifest.Files() {
			if _, err := a.opt.Blobs.Stat(ctx, f.Ref.Digest); errors.Is(err, errdefs.NotFound) {
				return noderpc.StoredReply{}, errdefs.Wrap(errdefs.NotFound, api.CodeLayerNotFound, err,
					"layer %s of sandbox %s's snapshot is not in the blob store", req.Layer.ID, req.ID)
			} else if err != nil {
				return noderpc.StoredReply{}, err
			}
		}
		return noderpc.StoredReply{}, nil
	}
	select {
	case <-job.done:
	case <-ctx.Done():
		return noderpc.StoredReply{}, ctx.Err()
	}
	return noderpc.StoredReply{Bytes: job.bytes}, job.err
}
