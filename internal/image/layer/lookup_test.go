package layer

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestStatMeta: a file is found in a layer's metadata image alone, for
// layers built by mkfs.erofs (directories) and by go-erofs (archives).
func TestStatMeta(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, a Artifact) {
		meta, err := os.ReadFile(filepath.Join(a.Dir, MetaFile))
		if err != nil {
			t.Fatal(err)
		}
		r := bytes.NewReader(meta)
		fi, err := StatMeta(r, "/opt/dsec/bin/dsec-guest")
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != 5 {
			t.Errorf("StatMeta(agent) = %v, %v; want a 5-byte regular file", fi, err)
		}
		if fi, err := StatMeta(r, "/opt/dsec"); err != nil || !fi.IsDir() {
			t.Errorf("StatMeta(dir) = %v, %v", fi, err)
		}
		if fi, err := StatMeta(r, "/link"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("StatMeta(symlink) = %v, %v; want the link itself", fi, err)
		}
		if _, err := StatMeta(r, "/opt/dsec/bin/other"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("StatMeta(missing) = %v, want ErrNotExist", err)
		}
		if _, err := StatMeta(bytes.NewReader(make([]byte, 4096)), "/x"); err == nil {
			t.Error("StatMeta of a non-EROFS image succeeded")
		}
	}
	t.Run("mkfs.erofs", func(t *testing.T) {
		requireMkfs(t)
		src := t.TempDir()
		mustWrite(t, filepath.Join(src, "opt/dsec/bin/dsec-guest"), []byte("agent"), 0o755)
		if err := os.Symlink("opt", filepath.Join(src, "link")); err != nil {
			t.Fatal(err)
		}
		a, err := BuildDir(ctx, src, t.TempDir(), BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, a)
	})
	t.Run("go-erofs", func(t *testing.T) {
		raw := makeTar(t, dir("opt/", 0o755), dir("opt/dsec/", 0o755), dir("opt/dsec/bin/", 0o755),
			file("opt/dsec/bin/dsec-guest", 0o755, []byte("agent")), symlink("link", "opt"))
		a, err := BuildTar(ctx, bytes.NewReader(raw), t.TempDir(), BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, a)
	})
}
