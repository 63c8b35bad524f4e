package node

import (
	"context"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// warmingLayers is the layer cache with Warm: it reports each warm's
// bottom layer.
type warmingLayers struct {
	*fakeLayers
	warmed chan string
}

func (l *warmingLayers) Warm(ctx context.Context, layers []layercache.Layer) error {
	l.warmed <- layers[0].ID
	return nil
}

// TestCreateWarmsLayersWhileQueued: a create that waits at the admission
// gate has its layers fetched meanwhile (the layer cache's Warm runs
// before the create's turn comes); a directory image has nothing to warm.
func TestCreateWarmsLayersWhileQueued(t *testing.T) {
	plainState(t)
	rt := newFakeRuntime(api.TierContainer)
	started, proceed := make(chan struct{}, 2), make(chan struct{})
	rt.onCreate = func(spec sandbox.Spec) error {
		started <- struct{}{}
		if spec.ID == "sb-1" {
			hold(proceed)
		}
		return nil
	}
	layers := &warmingLayers{fakeLayers: newFakeLayers(), warmed: make(chan string, 4)}
	a := newTestService(t, Options{Layers: layers, StateDir: t.TempDir(), Starts: StartLimits{Slots: 1, Queue: 10, Wait: time.Minute}}, rt)
	first := make(chan error, 1)
	go func() {
		first <- a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: layeredImage("L1")})
	}()
	testenv.Recv(t, started, wait, "the first create to start")
	if got := testenv.Recv(t, layers.warmed, wait, "the first create's warm"); got != "L1" {
		t.Errorf("warmed %s, want L1", got)
	}
	second := make(chan error, 1)
	go func() {
		second <- a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-2", Tier: api.TierContainer, Image: layeredImage("L2")})
	}()
	// The second create waits for the first's slot; its layers are
	// warmed all the same.
	if got := testenv.Recv(t, layers.warmed, wait, "the queued create's warm"); got != "L2" {
		t.Errorf("warmed %s, want L2", got)
	}
	if rt.creates() != 1 {
		t.Errorf("the runtime saw %d creates while the second waited, want 1", rt.creates())
	}
	close(proceed)
	for _, ch := range []chan error{first, second} {
		if err := testenv.Recv(t, ch, wait, "a create"); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Create(context.Background(), noderpc.CreateRequest{ID: "sb-3", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-layers.warmed:
		t.Errorf("a directory image was warmed (%s)", got)
	default:
	}
}
