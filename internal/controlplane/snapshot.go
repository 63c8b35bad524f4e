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
	rec, err := m.running(owner, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	r, err := m.recording(ctx, rec)
	if err != nil {
		return api.Snapshot{}, err
	}
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ff = nil
	}
	return m.snapshotLocked(ctx, rec, r)
}

// snapshotLocked takes a snapshot of rec (r, if not nil, is held).
func (m *Manager) snapshotLocked(ctx context.Context, rec store.SandboxRecord, r *recording) (api.Snapshot, error) {
	if rec.ImageSource != "layers" {
		return api.Snapshot{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier, "sandbox %s runs a directory image: only layered images can be snapshotted", rec.ID)
	}
	reply, err := m.nodes.Snapshot(ctx, rec.Node, rec.ID, noderpc.SnapshotRequest{ID: rec.ID})
	if err != nil {
		return api.Snapshot{}, err
	}
	lr, err := m.images.RegisterLayer(ctx, reply.Layer.Manifest)
	if err != nil {
		return api.Snapshot{}, err
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
			return api.Snapshot{}, err
		}
		imageID, state = img.ID, append(state, lr.ID)
	}
	snap := api.Snapshot{
		ID: "snap-" + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String()), Sandbox: rec.ID, Trajectory: rec.Trajectory,
		Tier: rec.Tier, Image: imageID, Layers: state, Bytes: reply.Bytes, CreatedAt: time.Now().UTC(),
	}
	if r != nil {
		snap.Step = r.next
	}
	if err := m.st.PutSnapshot(ctx, store.SnapshotRecord{Snapshot: snap, Owner: rec.Owner}); err != nil {
		return api.Snapshot{}, err
	}
	if _, err := m.mutate(ctx, rec.ID, func(sr *store.SandboxRecord) (bool, error) {
		sr.StateLayers, sr.StateImage = state, imageID
		// In use while the sandbox lives (layer removal checks Layers).
		if !slices.Contains(sr.Layers, lr.ID) {
			sr.Layers = append(sr.Layers, lr.ID)
		}
		return true, nil
	}); err != nil {
		return api.Snapshot{}, err
	}
	if r != nil {
		st := api.TrajectoryStep{Kind: api.KindSnapshot, Snapshot: &snap}
		if err := m.appendStep(ctx, r, rec, &st); err != nil {
			return api.Snapshot{}, err
		}
	}
	return snap, nil
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
