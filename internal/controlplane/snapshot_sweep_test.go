package controlplane

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/dsec-dev/dsec/internal/trajectory"
)

// sweepLayers is a layer registry for the sweep: a list, and what
// RemoveLayer removed (refusing, as the registry does, a layer inUse
// says a live sandbox runs).
type sweepLayers struct {
	fakeImages
	mu      sync.Mutex // guards following fields
	layers  []api.Layer
	removed []string
}

func (f *sweepLayers) ListLayers(ctx context.Context) ([]api.Layer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.layers), nil
}

func (f *sweepLayers) RemoveLayer(ctx context.Context, ref string, inUse func(string) bool) error {
	if inUse(ref) {
		return errdefs.New(errdefs.Conflict, api.CodeLayerInUse, "layer %s is used by a live sandbox", ref)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.layers = slices.DeleteFunc(f.layers, func(l api.Layer) bool { return l.ID == ref })
	f.removed = append(f.removed, ref)
	return nil
}

func (f *sweepLayers) gone() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.removed)
	slices.Sort(out)
	return out
}

// TestSnapshotSweep: expired snapshots (past their retention, or of a
// trajectory that is gone) are deleted and kept ones are not; a state
// layer goes once no snapshot names it and no live sandbox runs it, and
// never a young one, a named one or one of another source.
func TestSnapshotSweep(t *testing.T) {
	nc, _ := testenv.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	trajs, err := trajectory.Open(ctx, js, trajectory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { trajs.Close(context.Background()) })
	if err := trajs.Begin(ctx, trajectory.Head{Trajectory: api.Trajectory{ID: "t/live"}, Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := now.Add(-time.Hour)
	state := func(id string, at time.Time, names ...string) api.Layer {
		return api.Layer{ID: id, SourceKind: layer.SourceState, CreatedAt: at, Names: names}
	}
	reg := &sweepLayers{layers: []api.Layer{
		state("L-old", old), state("L-fresh", old), state("L-gone-traj", old), state("L-live-traj", old),
		state("L-young", now.Add(-time.Minute)), state("L-named", old, "keep/me"),
		{ID: "L-dir", SourceKind: layer.SourceDir, CreatedAt: old},
	}}
	h := newHarness(t, Options{Images: reg, Trajectories: trajs, Limits: Limits{SnapshotRetention: 24 * time.Hour}})
	snap := func(id, traj string, at time.Time, layers ...string) {
		t.Helper()
		if err := h.st.PutSnapshot(ctx, store.SnapshotRecord{Owner: "o", Snapshot: api.Snapshot{ID: id, Trajectory: traj, CreatedAt: at, Layers: layers}}); err != nil {
			t.Fatal(err)
		}
	}
	snap("snap-old", "", now.Add(-25*time.Hour), "L-old")
	snap("snap-fresh", "", now.Add(-23*time.Hour), "L-fresh")
	snap("snap-gone-traj", "t/gone", now, "L-gone-traj")
	snap("snap-live-traj", "t/live", now.Add(-30*24*time.Hour), "L-live-traj")
	// A forked child still runs the gone trajectory's layer.
	child := h.seed(t, store.SandboxRecord{Sandbox: api.Sandbox{ID: "sb-child", State: api.StateRunning}, Layers: []string{"L-gone-traj"}})

	if err := h.m.sweepSnapshots(ctx, now); err != nil {
		t.Fatal(err)
	}
	kept := func() []string {
		snaps, err := h.st.ListSnapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range snaps {
			ids = append(ids, s.ID)
		}
		slices.Sort(ids)
		return ids
	}
	if got, want := kept(), []string{"snap-fresh", "snap-live-traj"}; !slices.Equal(got, want) {
		t.Errorf("snapshots kept: %q, want %q", got, want)
	}
	if got, want := reg.gone(), []string{"L-old"}; !slices.Equal(got, want) {
		t.Errorf("layers removed: %q, want %q", got, want)
	}

	// The child ends: its layer goes. The trajectory is deleted: its
	// snapshot at once, its layer at the next sweep.
	_, rev, err := h.st.GetSandbox(ctx, child.ID)
	if err != nil {
		t.Fatal(err)
	}
	child.State = api.StateStopped
	if rev, err = h.st.peer().UpdateSandbox(ctx, child, rev); err != nil {
		t.Fatal(err)
	}
	h.m.cache.apply(child, rev)
	if err := h.m.DeleteTrajectory(ctx, "o", "t/live"); err != nil {
		t.Fatal(err)
	}
	if got, want := kept(), []string{"snap-fresh"}; !slices.Equal(got, want) {
		t.Errorf("snapshots kept after the trajectory's delete: %q, want %q", got, want)
	}
	if err := h.m.sweepSnapshots(ctx, now); err != nil {
		t.Fatal(err)
	}
	if got, want := reg.gone(), []string{"L-gone-traj", "L-live-traj", "L-old"}; !slices.Equal(got, want) {
		t.Errorf("layers removed at the second sweep: %q, want %q", got, want)
	}
}
