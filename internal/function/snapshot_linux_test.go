package function

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// layerWorld is a blob store and layer cache, with the test image as a
// layer, for sandboxes of [image, state layers…] as the node makes them.
type layerWorld struct {
	store blobstore.Store
	cache *layercache.Cache
	base  layerspec.Layer
}

func newLayerWorld(t *testing.T) *layerWorld {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the snapshot tests mount layers: run them as root")
	}
	ctx := context.Background()
	dir := t.TempDir()
	store, err := blobstore.NewLocal(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := layercache.New(ctx, layercache.Options{Dir: filepath.Join(dir, "layers"), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cache.GC(context.Background())
		_ = cache.Close(context.Background())
		testenv.NoMountsUnder(t, dir)
	})
	w := &layerWorld{store: store, cache: cache}
	a, err := layer.BuildDir(ctx, testImage(t).Root, filepath.Join(dir, "base"), layer.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.base = w.publish(t, a)
	return w
}

func (w *layerWorld) publish(t *testing.T, a layer.Artifact) layerspec.Layer {
	t.Helper()
	for name, ref := range map[string]layer.FileRef{layer.MetaFile: a.Manifest.Meta, layer.BlobFile: a.Manifest.Blob} {
		f, err := os.Open(filepath.Join(a.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.store.Put(context.Background(), ref.Digest, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return layerspec.Layer{ID: a.ID(), Manifest: a.Manifest}
}

// snapshot captures sb's workspace and publishes the layer.
func (w *layerWorld) snapshot(t *testing.T, sb *Sandbox, since *sandbox.StateIndex) (layerspec.Layer, *sandbox.StateIndex, int64) {
	t.Helper()
	ctx := context.Background()
	work := t.TempDir()
	idx, _, err := sb.CaptureState(ctx, filepath.Join(work, "tree"), since)
	if err != nil {
		t.Fatal(err)
	}
	a, err := layer.BuildState(ctx, filepath.Join(work, "tree"), filepath.Join(work, "out"))
	if err != nil {
		t.Fatal(err)
	}
	return w.publish(t, a), idx, a.Manifest.Meta.Size + a.Manifest.Blob.Size
}

// image is [base, layers…] as the node shows it to the function tier.
func (w *layerWorld) image(t *testing.T, layers ...layerspec.Layer) sandbox.Image {
	t.Helper()
	root, release, err := w.cache.View(context.Background(), append([]layerspec.Layer{w.base}, layers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return sandbox.Image{ID: "img", Name: "img", Root: root}
}

// workspaceListing lists a workspace: types, modes, sizes, times, link
// targets and contents.
func workspaceListing(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %d %d %x", fi.Size(), fi.ModTime().UnixNano(), layerspec.Digest(b))
		}
		if fi.IsDir() && rel != "." {
			line += fmt.Sprintf(" %d", fi.ModTime().UnixNano())
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// TestSnapshotRoundTrip: a function sandbox created from [image, state
// layer] has the snapshotted workspace; its writes do not reach the
// parent; a second snapshot holds the change only, deletions included.
func TestSnapshotRoundTrip(t *testing.T) {
	w := newLayerWorld(t)
	rt := newRuntime(t, t.TempDir(), Options{})
	ctx := context.Background()
	parent := create(t, rt, func(s *sandbox.Spec) { s.Image = w.image(t); s.DiskMB = 128 })
	fsys := parent.Files()
	for p, content := range map[string]string{"/workspace/a": "alpha", "/workspace/d/e/f": "deep", "/workspace/d/gone": "bye"} {
		if _, err := fsys.Write(ctx, p, strings.NewReader(content), sandbox.WriteOptions{Parents: true, Mode: 0o640}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fsys.Mkdir(ctx, "/workspace/empty", false); err != nil {
		t.Fatal(err)
	}
	if res := run(t, parent, "big", "write", "/workspace/big"); res.ExitCode != 0 {
		t.Fatal(res)
	}
	if err := os.Symlink("d/e/f", filepath.Join(parent.workDir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent.workDir, "large"), randomBytes(t, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	want := workspaceListing(t, parent.workDir)
	l1, idx, size1 := w.snapshot(t, parent, nil)
	if size1 < 8<<20 {
		t.Errorf("the first snapshot is %d bytes, want at least 8 MiB", size1)
	}
	child := create(t, rt, func(s *sandbox.Spec) { s.Image = w.image(t, l1) })
	if got := workspaceListing(t, child.workDir); got != want {
		t.Fatalf("the child's workspace differs:\nwant %s\ngot  %s", want, got)
	}
	if res := run(t, child, "", "cat", "/workspace/d/e/f"); res.Stdout != "deep" {
		t.Errorf("the child's command reads %+v", res)
	}
	if _, err := child.Files().Write(ctx, "/workspace/childonly", strings.NewReader("c"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Stat(ctx, "/workspace/childonly"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("the child's write reached the parent: %v", err)
	}

	// Incremental: 1 MiB more, a file of L1 removed.
	if err := fsys.Remove(ctx, "/workspace/d/gone", false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent.workDir, "mib"), randomBytes(t, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	want2 := workspaceListing(t, parent.workDir)
	l2, _, size2 := w.snapshot(t, parent, idx)
	if size2 >= 2<<20 {
		t.Errorf("the second snapshot after a 1 MiB change is %d bytes, want less than 2 MiB", size2)
	}
	grand := create(t, rt, func(s *sandbox.Spec) { s.Image = w.image(t, l1, l2) })
	if got := workspaceListing(t, grand.workDir); got != want2 {
		t.Errorf("[image, L1, L2]'s workspace differs:\nwant %s\ngot  %s", want2, got)
	}
	if want2 == want {
		t.Error("the listing does not see the change (negative control)")
	}

	if err := child.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := child.CaptureState(ctx, t.TempDir(), nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("snapshot of a destroyed sandbox: %v, want NotFound", err)
	}
}

// randomBytes are n bytes a layer cannot store as holes or compress.
func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
