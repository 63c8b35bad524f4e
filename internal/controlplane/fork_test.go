package controlplane

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// layeredImages resolves every name to a layered image and stacks and
// registers layers without a registry.
type layeredImages struct{ fakeImages }

func (layeredImages) Resolve(ctx context.Context, ref string) (image.Resolved, error) {
	return image.Resolved{ID: "img-" + ref, Name: ref, Manifest: store.ImageManifest{Version: 1}}, nil
}

func (layeredImages) Stack(ctx context.Context, base string, top []api.ImageLayer, tiers []string) (image.Resolved, error) {
	return image.Resolved{ID: base + "+" + top[0].ID, Manifest: store.ImageManifest{Version: 1}}, nil
}

func (layeredImages) RegisterLayer(ctx context.Context, m layer.Manifest, uploading bool) (store.LayerRecord, error) {
	return store.LayerRecord{ID: "sha256:state"}, nil
}

// uploadingNodes snapshot in the background; their uploads end when
// release is closed.
type uploadingNodes struct {
	*fakeNodes
	release chan struct{}
}

func (n *uploadingNodes) Snapshot(ctx context.Context, node, id string, req noderpc.SnapshotRequest) (noderpc.SnapshotReply, error) {
	return noderpc.SnapshotReply{Layer: noderpc.LayerRef{ID: "sha256:state"}, Full: true, Stored: !req.Background}, nil
}

func (n *uploadingNodes) Stored(ctx context.Context, node, id string, l noderpc.LayerRef) (noderpc.StoredReply, error) {
	select {
	case <-n.release:
		return noderpc.StoredReply{Bytes: 4096}, nil
	case <-ctx.Done():
		return noderpc.StoredReply{}, ctx.Err()
	}
}

// TestForkWaitsForUploadOffNode: a fork's children on the parent's node
// start while the snapshot's layer uploads (it is in that node's cache);
// a child placed on another node, which must fetch the layer, is made
// only once the upload ended; the fork answers after it, with the bytes
// it stored in the snapshot's record.
func TestForkWaitsForUploadOffNode(t *testing.T) {
	st, fake := newMemStore(), newFakeNodes()
	nodes := &uploadingNodes{fakeNodes: fake, release: make(chan struct{})}
	m := New(Options{Store: st, Nodes: nodes, Images: layeredImages{},
		Limits: Limits{DefaultImages: map[string]string{api.TierContainer: "ct"}}})
	t.Cleanup(m.Stop)
	// The parent on n1, which then has room for one child more.
	ctx := context.Background()
	st.setNodes(testNode("n1", 2))
	m.refreshNodes(ctx)
	parent, err := m.Create(ctx, "o", api.CreateSandboxRequest{Tier: api.TierContainer})
	if err != nil || parent.Node != "n1" {
		t.Fatalf("parent %+v, %v; want it on n1", parent, err)
	}
	n1 := testNode("n1", 2)
	n1.Usage.Sandboxes = 1
	st.setNodes(n1, testNode("n2", 10))
	m.refreshNodes(ctx)
	var mu sync.Mutex
	var released bool
	var early []string
	fake.onCreate = func(node string, req noderpc.CreateRequest) error {
		mu.Lock()
		defer mu.Unlock()
		if node == "n1" && !released {
			// The sibling on the parent's node starts during the upload.
			// A sibling on n2 that did not wait would be made meanwhile;
			// then the upload ends.
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			mu.Lock()
			released = true
			close(nodes.release)
		} else if node != "n1" && !released {
			early = append(early, node+"/"+req.ID)
		}
		return nil
	}
	fr, err := m.Fork(ctx, "o", parent.ID, api.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !released {
		t.Fatal("no child was made on the parent's node during the upload")
	}
	if len(early) > 0 {
		t.Errorf("children made on another node before the upload ended: %q", early)
	}
	onN2 := 0
	for _, c := range fr.Sandboxes {
		if c.Node == "n2" {
			onN2++
		}
	}
	if len(fr.Sandboxes) != 2 || onN2 != 1 {
		t.Errorf("fork(2) made %+v, want one child on n2", fr.Sandboxes)
	}
	rec, err := st.GetSnapshot(ctx, fr.Snapshot.ID)
	if err != nil || fr.Snapshot.Bytes != 4096 || rec.Bytes != 4096 {
		t.Errorf("the fork's snapshot: %+v; its record %+v, %v; want 4096 bytes stored", fr.Snapshot, rec, err)
	}
}
