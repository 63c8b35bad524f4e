package node

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// beats collects heartbeats.
type beats struct {
	mu      sync.Mutex // guards following fields
	last    api.Node
	n       int
	deleted bool
}

func (b *beats) PutNode(ctx context.Context, n api.Node) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.last, b.n = n, b.n+1
	return nil
}

func (b *beats) DeleteNode(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deleted = true
	return nil
}

// TestOverTheWire: the node as the control plane's client reaches it over
// NATS: creates, lists and destroys; a refusal keeps its class and retry
// hint (the control plane decides on them); a sandbox that ends by itself
// is reported; the node heartbeats, and says goodbye when it stops.
func TestOverTheWire(t *testing.T) {
	nc, _ := testenv.NATS(t)
	rt := newFakeRuntime(api.TierContainer)
	reg := sandbox.NewRegistry()
	if err := reg.Register(rt); err != nil {
		t.Fatal(err)
	}
	a, err := New(Options{ID: "n1", Registry: reg, MaxSandboxes: 1, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hb := &beats{}
	ctx := context.Background()
	if err := a.Start(ctx, nc, hb); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			a.Stop(ctx, hb)
		}
	}
	defer stop()
	c := noderpc.NewClient(nc)
	reports := make(chan noderpc.EndedReport, 1)
	stopServe, err := c.ServeEnded(func(r noderpc.EndedReport) error { reports <- r; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer stopServe()

	hb.mu.Lock()
	first := hb.last
	hb.mu.Unlock()
	if first.ID != "n1" || first.Capacity.MaxSandboxes != 1 || len(first.Tiers) != 1 {
		t.Errorf("first heartbeat %+v", first)
	}
	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "sb-1", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	err = c.Create(ctx, "n1", noderpc.CreateRequest{ID: "sb-2", Tier: api.TierContainer, Image: dirImage(t)})
	if errdefs.ClassOf(err) != errdefs.Unavailable || errdefs.CodeOf(err) != api.CodeNodeFull {
		t.Errorf("a create past the node's cap: %v (%s %s)", err, errdefs.ClassOf(err), errdefs.CodeOf(err))
	}
	got, err := c.List(ctx, "n1")
	if err != nil || len(got) != 1 || got[0].ID != "sb-1" || got[0].Tier != api.TierContainer {
		t.Fatalf("list = %+v, %v", got, err)
	}

	rt.end("sb-1", sandbox.EndAgentExited)
	select {
	case r := <-reports:
		if r.Node != "n1" || r.ID != "sb-1" || r.Tier != api.TierContainer || r.Reason != sandbox.EndAgentExited {
			t.Errorf("report %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report of the sandbox's end")
	}
	if got, err := c.List(ctx, "n1"); err != nil || len(got) != 0 {
		t.Errorf("after the end: %+v, %v", got, err)
	}

	if err := c.Create(ctx, "n1", noderpc.CreateRequest{ID: "sb-3", Tier: api.TierContainer, Image: dirImage(t)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(ctx, "n1", "sb-3"); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(ctx, "n1", "sb-unknown"); err != nil {
		t.Errorf("destroying an unknown sandbox: %v", err)
	}
	if rt.sandbox("sb-3").destroyed() != 1 {
		t.Error("the runtime's sandbox was not destroyed")
	}
	stop()
	hb.mu.Lock()
	deleted := hb.deleted
	hb.mu.Unlock()
	if !deleted {
		t.Error("the node's record was not removed at Stop")
	}
}
