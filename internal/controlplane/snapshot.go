package controlplane

import (
	"context"
	"crypto/rand"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// RoleState is the role of a snapshot's layers in its image.
const RoleState = "state"

// Snapshot stores a running sandbox's writable state as a layer, and
// returns the snapshot: an image made of the sandbox's image and its
// state layers, which from_snapshot, fork and resume start from. In a
// recorded sandbox it is a step of the trajectory.
func (m *Manager) Snapshot(ctx context.Context, owner, id string) (api.Snapshot, error) {
	rec, r, unlock, err := m.holdForSnapshot(ctx, owner, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	defer unlock()
	return m.snapshotLocked(ctx, rec, r)
}

// holdForSnapshot returns owner's running sandbox id and its recording
// (nil without a trajectory), held until unlock: a snapshot is the
// trajectory's next step, and it ends a fast-forward.
func (m *Manager) holdForSnapshot(ctx context.Context, owner, id string) (store.SandboxRecord, *recording, func(), error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return rec, nil, nil, err
	}
	r, err := m.recording(ctx, rec)
	if err != nil {
		return rec, nil, nil, err
	}
	if r == nil {
		return rec, nil, func() {}, nil
	}
	r.mu.Lock()
	r.ff = nil
	return rec, r, r.mu.Unlock, nil
}

// snapshotLocked takes a snapshot of rec (r, if not nil, is held).
func (m *Manager) snapshotLocked(ctx context.Context, rec store.SandboxRecord, r *recording) (api.Snapshot, error) {
	p, err := m.beginSnapshot(ctx, rec, r, false)
	if err != nil {
		return api.Snapshot{}, err
	}
	return m.endSnapshot(ctx, p, r)
}

// pendingSnapshot is a snapshot recorded (others may start from it on
// its node) whose layer may still be uploading, and which its sandbox's
// record and trajectory do not show yet.
type pendingSnapshot struct {
	snap    api.Snapshot
	rec     store.SandboxRecord
	reply   noderpc.SnapshotReply
	layerID string
}

// beginSnapshot has rec's node snapshot it (with background, answering
// before the layer is uploaded) and records the snapshot: from_snapshot
// may use it on that node at once. endSnapshot, or dropSnapshot if the
// upload fails, must follow, with r (if not nil) held throughout.
func (m *Manager) beginSnapshot(ctx context.Context, rec store.SandboxRecord, r *recording, background bool) (*pendingSnapshot, error) {
	if rec.ImageSource != "layers" {
		return nil, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier, "sandbox %s runs a directory image: only layered images can be snapshotted", rec.ID)
	}
	reply, err := m.nodes.Snapshot(ctx, rec.Node, rec.ID, noderpc.SnapshotRequest{ID: rec.ID, Background: background})
	if err != nil {
		return nil, err
	}
	lr, err := m.images.RegisterLayer(ctx, reply.Layer.Manifest, !reply.Stored)
	if err != nil {
		return nil, err
	}
	// The new layer goes on the image of the sandbox's last snapshot, or,
	// if it is the first or a full one (the node lost its index of the
	// last), on the sandbox's own image.
	base, prev := rec.ImageID, rec.BaseState
	if rec.StateImage != "" && !reply.Full {
		base, prev = rec.StateImage, rec.StateLayers
	}
	// The same delta again (nothing changed since the last snapshot:
	// empty deltas are equal) is not stacked twice: applying it twice is
	// applying it once, and a stack may not name a layer twice.
	imageID, state := base, slices.Clone(prev)
	if n := len(prev); n == 0 || prev[n-1] != lr.ID {
		img, err := m.images.Stack(ctx, base, []api.ImageLayer{{Role: RoleState, ID: lr.ID}}, snapshotTiers(rec.Tier))
		if err != nil {
			return nil, err
		}
		imageID, state = img.ID, append(state, lr.ID)
	}
	p := &pendingSnapshot{rec: rec, reply: reply, layerID: lr.ID}
	p.snap = api.Snapshot{
		ID: "snap-" + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String()), Sandbox: rec.ID, Trajectory: rec.Trajectory,
		Tier: rec.Tier, Image: imageID, Layers: state, Bytes: reply.Bytes, CreatedAt: time.Now().UTC(),
	}
	if r != nil {
		p.snap.Step = r.next
	}
	if err := m.st.PutSnapshot(ctx, store.SnapshotRecord{Snapshot: p.snap, Owner: rec.Owner}); err != nil {
		return nil, err
	}
	return p, nil
}

// awaitStored waits for the upload of a background snapshot's layer.
func (m *Manager) awaitStored(ctx context.Context, p *pendingSnapshot) error {
	if p.reply.Stored {
		return nil
	}
	sr, err := m.nodes.Stored(ctx, p.rec.Node, p.rec.ID, p.reply.Layer)
	if err != nil {
		return err
	}
	p.reply.Stored, p.snap.Bytes = true, sr.Bytes
	if sr.Bytes == 0 {
		return nil
	}
	return m.st.UpdateSnapshot(ctx, store.SnapshotRecord{Snapshot: p.snap, Owner: p.rec.Owner})
}

// dropSnapshot forgets a snapshot whose layer was not stored.
func (m *Manager) dropSnapshot(ctx context.Context, p *pendingSnapshot) {
	if err := m.st.DeleteSnapshot(context.WithoutCancel(ctx), p.snap.ID); err != nil {
		m.log.Warn("forgetting a snapshot whose layer was not stored", "snapshot", p.snap.ID, "err", err)
	}
}

// endSnapshot waits for the layer's upload, then makes the snapshot the
// sandbox's last and, in a recorded sandbox, a step of its trajectory.
func (m *Manager) endSnapshot(ctx context.Context, p *pendingSnapshot, r *recording) (api.Snapshot, error) {
	if err := m.awaitStored(ctx, p); err != nil {
		m.dropSnapshot(ctx, p)
		return api.Snapshot{}, err
	}
	state, imageID := p.snap.Layers, p.snap.Image
	if _, err := m.mutate(ctx, p.rec.ID, func(sr *store.SandboxRecord) (bool, error) {
		sr.StateLayers, sr.StateImage = state, imageID
		// In use while the sandbox lives (layer removal checks Layers).
		if !slices.Contains(sr.Layers, p.layerID) {
			sr.Layers = append(sr.Layers, p.layerID)
		}
		return true, nil
	}); err != nil {
		return api.Snapshot{}, err
	}
	if r != nil {
		snap := p.snap
		st := api.TrajectoryStep{Kind: api.KindSnapshot, Snapshot: &snap}
		if err := m.appendStep(ctx, r, p.rec, &st); err != nil {
			return api.Snapshot{}, err
		}
	}
	return p.snap, nil
}

// snapshotTiers are the tiers a snapshot of tier can start.
func snapshotTiers(tier string) []string {
	if snapshotPortable(tier, tier) {
		return []string{api.TierContainer, api.TierFunction}
	}
	return []string{tier}
}

// snapshot returns a snapshot owner may use.
func (m *Manager) snapshot(ctx context.Context, owner, id string) (api.Snapshot, error) {
	r, err := m.st.GetSnapshot(ctx, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	if r.Owner != owner {
		return api.Snapshot{}, errdefs.New(errdefs.NotFound, api.CodeSnapshotNotFound, "snapshot %q not found", id)
	}
	return r.Snapshot, nil
}

// GetSnapshot returns one of owner's snapshots.
func (m *Manager) GetSnapshot(ctx context.Context, owner, id string) (api.Snapshot, error) {
	return m.snapshot(ctx, owner, id)
}

// DeleteSnapshot forgets one of owner's snapshots. Its layers go with
// the layer garbage collection once no image or sandbox uses them.
func (m *Manager) DeleteSnapshot(ctx context.Context, owner, id string) error {
	if _, err := m.snapshot(ctx, owner, id); err != nil {
		return err
	}
	return m.st.DeleteSnapshot(ctx, id)
}
