package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/tardir"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/sys"
)

// layerMounts counts the node's erofs layer mounts and overlay views.
func (u *up) layerMounts(t *testing.T) (layers, views int) {
	t.Helper()
	ms, err := sys.MountsUnder(filepath.Join(u.dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		switch {
		case strings.Contains(m, "/layers/mnt/"):
			layers++
		case strings.Contains(m, "/layers/views/"):
			views++
		}
	}
	return layers, views
}

// workspaceImage uploads a workspace layer made from a directory and
// composes it with the built-in function tools.
func workspaceImage(t *testing.T, c *client.Client) (*api.Layer, *api.Image) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "data"), 0o755)
	os.WriteFile(filepath.Join(src, "data", "hello.txt"), []byte("from the workspace layer\n"), 0o644)
	var tarBuf bytes.Buffer
	if err := tardir.Write(src, &tarBuf); err != nil {
		t.Fatal(err)
	}
	ws, err := c.ImportLayer(ctx, client.KindTar, &tarBuf, "workspace/demo:v1")
	if err != nil {
		t.Fatal(err)
	}
	img, err := c.CreateImage(ctx, api.CreateImageRequest{Name: "team/demo:v1", Workspace: "workspace/demo:v1", Toolkit: "toolkit/wasm-tools", Tiers: []string{"function"}})
	if err != nil {
		t.Fatal(err)
	}
	return ws, img
}

func TestLayeredImagesEndToEnd(t *testing.T) {
	dir := t.TempDir()
	keep := func(c *config.Config) { c.KeepSandboxes = true }
	u := startUp(t, dir, keep)
	ctx := context.Background()
	ws, img := workspaceImage(t, u.c)
	if len(img.Layers) != 2 || img.Layers[0].Role != "workspace" || img.Layers[0].ID != ws.ID {
		t.Fatalf("image = %+v", img)
	}
	if got, err := u.c.GetImage(ctx, "team/demo:v1"); err != nil || got.ID != img.ID {
		t.Fatalf("GetImage = %+v, %v", got, err)
	}

	// 100 sandboxes share one mount per layer and one view of the stack.
	var ids []string
	for i := 0; i < 100; i++ {
		sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "team/demo:v1"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	res, err := u.c.Exec(ctx, ids[42], api.ExecRequest{Cmd: []string{"cat", "/data/hello.txt"}})
	if err != nil || res.Stdout != "from the workspace layer\n" {
		t.Fatalf("reading a file of the workspace layer: %+v, %v", res, err)
	}
	if l, v := u.layerMounts(t); l != 2 || v != 1 {
		t.Errorf("100 sandboxes: %d layer mounts and %d views, want 2 and 1", l, v)
	}
	// Inline layers: the same stack, composed on create.
	inline, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Layers: []api.ImageLayer{{Role: "workspace", ID: ws.ID}, {Role: "toolkit", ID: "toolkit/wasm-tools"}}})
	if err != nil {
		t.Fatalf("inline layers: %v", err)
	}
	if got, err := u.c.GetImage(ctx, inline.ImageID); err != nil || len(got.Layers) != 2 || got.Layers[0].ID != ws.ID || got.Layers[1].ID != img.Layers[1].ID {
		t.Errorf("inline image = %+v, %v", got, err)
	}
	if l, v := u.layerMounts(t); l != 2 || v != 1 {
		t.Errorf("the same stack inline: %d layer mounts and %d views, want 2 and 1", l, v)
	}
	ids = append(ids, inline.ID)

	// In use: neither the layer nor the image can go.
	if err := u.c.DeleteLayer(ctx, ws.ID); !client.IsConflict(err) {
		t.Errorf("deleting a layer in use: %v, want 409", err)
	}
	if err := u.c.DeleteImage(ctx, img.ID); !client.IsConflict(err) {
		t.Errorf("deleting an image in use: %v, want 409", err)
	}

	// A node restart with sandboxes running keeps the mounts and their
	// counts: nothing is mounted again, nothing is lost.
	u.stop()
	u = startUp(t, dir, nil)
	if l, v := u.layerMounts(t); l != 2 || v != 1 {
		t.Errorf("after restart: %d layer mounts and %d views, want 2 and 1", l, v)
	}
	for _, id := range ids[:3] {
		res, err := u.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"cat", "/data/hello.txt"}})
		if err != nil || res.Stdout != "from the workspace layer\n" {
			t.Errorf("after restart, %s: %+v, %v", id, res, err)
		}
	}
	for _, id := range ids {
		if err := u.c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.c.DeleteImage(ctx, img.ID); err != nil {
		t.Errorf("deleting an unused image: %v", err)
	}
	if err := u.c.DeleteLayer(ctx, ws.ID); err != nil {
		t.Errorf("deleting an unused layer: %v", err)
	}
	if _, err := u.c.GetLayer(ctx, "workspace/demo:v1"); !client.IsNotFound(err) {
		t.Errorf("a deleted layer's name resolves: %v", err)
	}
	// The harness checks that shutdown's collection leaves no mounts.
}

func TestImportDockerSaveArchive(t *testing.T) {
	u := startUp(t, "", nil)
	ctx := context.Background()
	img, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference("example.com/test:1")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(ref, img, &buf); err != nil {
		t.Fatal(err)
	}
	l, err := u.c.ImportLayer(ctx, client.KindOCI, &buf, "base/random:1")
	if err != nil {
		t.Fatal(err)
	}
	if l.SourceKind != "docker" || l.BlobSize == 0 || !strings.HasPrefix(l.ID, "sha256:") {
		t.Errorf("imported layer = %+v", l)
	}
	if _, err := u.c.ImportLayer(ctx, client.KindTar, strings.NewReader("not a tar at all, not even close"), ""); !client.IsInvalid(err) {
		t.Errorf("garbage upload: %v, want 400", err)
	}
	layers, err := u.c.ListLayers(ctx)
	if err != nil || len(layers.Layers) < 4 { // the built-ins and this one
		t.Errorf("ListLayers = %+v, %v", layers, err)
	}
}
