package layercache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
)

// TestAdopt: a layer built on the node and adopted mounts without a
// fetch, even though the store does not hold it; without the adoption
// the same mount fails (the negative control).
func TestAdopt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	src := filepath.Join(e.root, "state")
	if err := os.MkdirAll(filepath.Join(src, "workspace"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := random(7, 2<<20+5)
	if err := os.WriteFile(filepath.Join(src, "workspace", "state.bin"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	art, err := layer.BuildState(ctx, src, filepath.Join(e.root, "built"))
	if err != nil {
		t.Fatal(err)
	}
	l := Layer{ID: art.ID(), Manifest: art.Manifest}

	c := e.open(Options{})
	defer c.Close(ctx)
	if _, _, err := c.View(ctx, []Layer{l}); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("View of a layer neither stored nor adopted: %v, want NotFound", err)
	}
	if err := c.Adopt(ctx, art); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(art.Dir); err != nil { // the snapshot's scratch goes; the cache keeps its links
		t.Fatal(err)
	}
	view, release, err := c.View(ctx, []Layer{l})
	if err != nil {
		t.Fatalf("View of an adopted layer: %v", err)
	}
	checkFiles(t, view, map[string]string{"workspace/state.bin": data})
	release()
	if st := c.Stats(); st.Fetches != 0 || st.Layers != 1 || st.Bytes < int64(len(data)) {
		t.Errorf("stats after adoption: %+v, want no fetch and one layer of at least %d bytes", st, len(data))
	}
	if err := c.Adopt(ctx, art); err != nil { // held already: nothing to do, even with its files gone
		t.Errorf("second Adopt: %v", err)
	}
	gcAndCheckEmpty(t, c, e.dir)
}
