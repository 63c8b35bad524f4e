package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/blobstore"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/layer"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestNormalize(t *testing.T) {
	good := map[string]string{"wasm-tools": "wasm-tools:latest", "base/debian-12:2026.11": "base/debian-12:2026.11"}
	for in, want := range good {
		if got, err := Normalize(in); err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "UPPER", "a/../b", "a b", "x:", "/abs", "trailing/", "a:b:c", "a//b"} {
		if _, err := Normalize(bad); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Normalize(%q): err = %v, want Invalid", bad, err)
		}
	}
}

type env struct {
	r     *Registry
	blobs *blobstore.Local
}

func newEnv(t *testing.T) env {
	nc, _ := testenv.NATS(t)
	st, err := store.Open(context.Background(), nc, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return env{r: New(Options{Records: st, Blobs: blobs, WorkDir: t.TempDir()}), blobs: blobs}
}

// buildLayer builds a small layer holding file name with content.
func buildLayer(t *testing.T, name, content string) layer.Artifact {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("building layers needs root (mkfs keeps owners)")
	}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, name), []byte(content), 0o644)
	a, err := layer.BuildDir(context.Background(), src, filepath.Join(t.TempDir(), "out"), layer.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestLayersAndImages(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	base, err := e.r.AddLayer(ctx, buildLayer(t, "base.txt", "base"), "base/test:1")
	if err != nil {
		t.Fatal(err)
	}
	tk, err := e.r.AddLayer(ctx, buildLayer(t, "tool.txt", "tool"), "toolkit/test:1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"base/test:1", "base/test", base.ID} {
		if got, err := e.r.ResolveLayer(ctx, ref); err != nil || got.ID != base.ID {
			t.Errorf("ResolveLayer(%q) = %s, %v", ref, got.ID, err)
		}
	}
	if _, err := e.blobs.Stat(ctx, base.Manifest.Blob.Digest); err != nil {
		t.Errorf("layer blob not in the store: %v", err)
	}
	img, err := e.r.Create(ctx, "team/env:v1", []api.ImageLayer{{Role: RoleBase, ID: "base/test:1"}, {Role: RoleToolkit, ID: tk.ID}}, []string{"function"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.r.Compose(ctx, []api.ImageLayer{{Role: RoleBase, ID: base.ID}, {Role: RoleToolkit, ID: "toolkit/test:1"}}, []string{"function"})
	if err != nil || again.ID != img.ID {
		t.Errorf("the same composition has another ID: %s vs %s (%v)", again.ID, img.ID, err)
	}
	for _, ref := range []string{"team/env:v1", img.ID} {
		got, err := e.r.Resolve(ctx, ref)
		if err != nil || got.ID != img.ID || len(got.Layers) != 2 || got.Layers[0].ID != base.ID || !got.Supports("function") || got.Supports("container") {
			t.Errorf("Resolve(%q) = %+v, %v", ref, got, err)
		}
	}
	if _, err := e.r.Tag(ctx, "team/env:v1", "team/env:stable"); err != nil {
		t.Fatal(err)
	}
	list, err := e.r.List(ctx)
	if err != nil || len(list) != 2 {
		t.Errorf("List = %+v, %v", list, err)
	}
	// Layers an image uses, or a live sandbox, cannot go.
	if err := e.r.RemoveLayer(ctx, base.ID, nil); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("removing a layer an image uses: %v, want Conflict", err)
	}
	if err := e.r.Remove(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Resolve(ctx, "team/env:stable"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a name of a removed image still resolves: %v", err)
	}
	if err := e.r.RemoveLayer(ctx, base.ID, func(string) bool { return true }); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("removing a layer a sandbox uses: %v, want Conflict", err)
	}
	if err := e.r.RemoveLayer(ctx, base.ID, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := e.blobs.Stat(ctx, base.Manifest.Meta.Digest); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a removed layer's blobs remain: %v", err)
	}
	if _, err := e.r.ResolveLayer(ctx, "base/test:1"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a removed layer's name still resolves: %v", err)
	}
	if _, err := e.r.Compose(ctx, []api.ImageLayer{{Role: RoleBase, ID: "no/such:1"}}, nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("composing a missing layer: %v", err)
	}
	if _, err := e.r.Compose(ctx, nil, nil); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("composing nothing: %v", err)
	}
}

func TestDirImages(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := t.TempDir()
	rec, err := e.r.AddDir(ctx, "tools", dir, []string{"function"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Name != "tools:latest" || rec.Source() != "dir:"+dir {
		t.Errorf("AddDir = %+v", rec)
	}
	for _, ref := range []string{"tools", rec.ID} {
		if got, err := e.r.Resolve(ctx, ref); err != nil || got.ID != rec.ID {
			t.Errorf("Resolve(%q) = %+v, %v", ref, got, err)
		}
	}
	if _, err := e.r.AddDir(ctx, "x", dir+"/missing", nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("AddDir(missing dir): %v", err)
	}
	if _, err := e.r.AddDir(ctx, "x", "relative/dir", nil); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("AddDir(relative): %v", err)
	}
	if _, err := e.r.Resolve(ctx, "nope"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Resolve(unknown): %v", err)
	}
}

// TestLayerFiles: a layer's paths (with whether each is a directory) and
// a file's content come from its EROFS metadata and blob in the store;
// missing and oversized files are errors of their classes.
func TestLayerFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("building layers needs root (mkfs keeps owners)")
	}
	e := newEnv(t)
	ctx := context.Background()
	src := t.TempDir()
	for p, body := range map[string]string{"workspace/calc/calc_test.go": "package calc\n", "workspace/web/add.test.js": "test()\n", "tests.json": `{"tests":[]}`} {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(src, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := layer.BuildDir(ctx, src, filepath.Join(t.TempDir(), "out"), layer.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.r.AddLayer(ctx, a, "tests/files:1")
	if err != nil {
		t.Fatal(err)
	}
	paths, err := e.r.LayerPaths(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"/workspace": true, "/workspace/calc": true, "/workspace/calc/calc_test.go": false,
		"/workspace/web": true, "/workspace/web/add.test.js": false, "/tests.json": false}
	if len(paths) != len(want) {
		t.Errorf("LayerPaths = %v, want %v", paths, want)
	}
	for p, dir := range want {
		if got, ok := paths[p]; !ok || got != dir {
			t.Errorf("LayerPaths[%s] = %v %v, want %v", p, got, ok, dir)
		}
	}
	if b, err := e.r.ReadLayerFile(ctx, rec.ID, "/workspace/calc/calc_test.go", 1024); err != nil || string(b) != "package calc\n" {
		t.Errorf("ReadLayerFile = %q, %v", b, err)
	}
	if _, err := e.r.ReadLayerFile(ctx, rec.ID, "/nothing", 1024); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a missing file: %v, want NotFound", err)
	}
	if _, err := e.r.ReadLayerFile(ctx, rec.ID, "/workspace/calc/calc_test.go", 4); !errors.Is(err, errdefs.TooLarge) {
		t.Errorf("a file past the limit: %v, want TooLarge", err)
	}
	if _, err := e.r.ReadLayerFile(ctx, rec.ID, "/workspace/calc", 1024); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("a directory: %v, want Invalid", err)
	}
	if _, err := e.r.LayerPaths(ctx, "sha256:"+strings.Repeat("0", 64)); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a missing layer: %v, want NotFound", err)
	}
}
