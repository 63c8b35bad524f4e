package controlplane

import (
	"context"
	"errors"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/store"
)

// Snapshots are kept while they can be used: a recorded sandbox's as long
// as its trajectory (resume starts from it), another for
// Limits.SnapshotRetention after it was taken, unless deleted before. A
// state layer that no snapshot names and no live sandbox runs is then
// removed, with its blobs and the images stacked on it: deleting a
// snapshot or a trajectory frees its storage at the next sweep, and a
// forked child that still runs a layer keeps it until it ends.

// stateLayerGrace spares state layers younger than this: a snapshot
// registers its layer before it writes its record.
const stateLayerGrace = 10 * time.Minute

// LayerSweeper is the part of the image registry the sweep uses; the
// daemon asserts its registry has it, so the sweep cannot silently stop.
type LayerSweeper interface {
	ListLayers(ctx context.Context) ([]api.Layer, error)
	RemoveLayer(ctx context.Context, ref string, inUse func(layerID string) bool) error
}

func (m *Manager) snapshotLoop(ctx context.Context) {
	m.every(ctx, m.opt.SnapshotSweep, func(ctx context.Context, now time.Time) {
		if !m.leases.leading() {
			return
		}
		if err := m.sweepSnapshots(ctx, now); err != nil && ctx.Err() == nil {
			m.log.Warn("sweeping snapshots", "err", err)
		}
	})
}

// sweepSnapshots deletes the snapshots whose time is up, then the state
// layers nothing holds.
func (m *Manager) sweepSnapshots(ctx context.Context, now time.Time) error {
	snaps, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	named := map[string]bool{} // state layers a kept snapshot names
	for _, s := range snaps {
		expired, err := m.snapshotExpired(ctx, s, now)
		if err != nil {
			return err
		}
		if !expired {
			for _, l := range s.Layers {
				named[l] = true
			}
			continue
		}
		if err := m.st.DeleteSnapshot(ctx, s.ID); err != nil {
			return err
		}
		m.log.Debug("snapshot expired", "snapshot", s.ID, "trajectory", s.Trajectory)
	}
	ls, ok := m.images.(LayerSweeper)
	if !ok {
		return nil
	}
	layers, err := ls.ListLayers(ctx)
	if err != nil {
		return err
	}
	for _, l := range layers {
		if l.SourceKind != layer.SourceState || named[l.ID] || len(l.Names) > 0 || now.Sub(l.CreatedAt) < stateLayerGrace || m.LayerInUse(l.ID) {
			continue
		}
		err := ls.RemoveLayer(ctx, l.ID, m.LayerInUse)
		switch {
		case err == nil:
			m.log.Debug("state layer removed", "layer", l.ID)
		case errdefs.ClassOf(err) == errdefs.Conflict, errdefs.ClassOf(err) == errdefs.NotFound:
			// Taken into use, or removed, meanwhile: the next sweep sees.
		default:
			return err
		}
	}
	return nil
}

// snapshotExpired: a snapshot of a trajectory goes with it; another when
// its retention is over.
func (m *Manager) snapshotExpired(ctx context.Context, s store.SnapshotRecord, now time.Time) (bool, error) {
	if s.Trajectory == "" || m.traj == nil {
		return now.Sub(s.CreatedAt) > m.lim.SnapshotRetention, nil
	}
	_, _, err := m.traj.Head(ctx, s.Trajectory)
	if errdefs.ClassOf(err) == errdefs.NotFound {
		return true, nil
	}
	return false, err
}

// deleteTrajectorySnapshots forgets the snapshots taken in trajectory id.
func (m *Manager) deleteTrajectorySnapshots(ctx context.Context, id string) error {
	snaps, err := m.st.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range snaps {
		if s.Trajectory == id {
			errs = append(errs, m.st.DeleteSnapshot(ctx, s.ID))
		}
	}
	return errors.Join(errs...)
}
