package layer

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// TestBuildStateWhiteouts: a state layer keeps whiteouts (character
// devices 0/0) and opaque markers, and still refuses any other device
// node; a plain layer refuses whiteouts too.
func TestBuildStateWhiteouts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the state layer tests make device nodes: run them as root")
	}
	ctx := context.Background()
	src := t.TempDir()
	if err := os.Mkdir(filepath.Join(src, "opq"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := sys.SetXattr(filepath.Join(src, "opq"), "trusted.overlay.opaque", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := sys.Mknod(filepath.Join(src, "gone"), syscall.S_IFCHR, 0, 0); err != nil {
		t.Fatal(err)
	}
	a, err := BuildState(ctx, src, filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatalf("a state layer with a whiteout and an opaque dir: %v", err)
	}
	if a.Manifest.Source.Kind != SourceState {
		t.Errorf("source kind %q", a.Manifest.Source.Kind)
	}
	// The same tree builds to the same layer.
	b, err := BuildState(ctx, src, filepath.Join(t.TempDir(), "out"))
	if err != nil || b.ID() != a.ID() {
		t.Errorf("a second build: %v, ID %s vs %s", err, b.ID(), a.ID())
	}
	// The opaque marker is part of the tree: without it, another layer.
	noOpq := t.TempDir()
	if err := os.Mkdir(filepath.Join(noOpq, "opq"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := sys.Mknod(filepath.Join(noOpq, "gone"), syscall.S_IFCHR, 0, 0); err != nil {
		t.Fatal(err)
	}
	if c, err := BuildState(ctx, noOpq, filepath.Join(t.TempDir(), "out")); err != nil || c.Manifest.Source.Digest == a.Manifest.Source.Digest {
		t.Errorf("a tree without the opaque marker: %v, same source digest", err)
	}
	if _, err := BuildDir(ctx, src, filepath.Join(t.TempDir(), "out"), BuildOptions{}); errdefs.CodeOf(err) != "device_node" {
		t.Errorf("a plain layer with a whiteout: %v, want device_node", err)
	}
	// Any other device node is refused.
	dev := t.TempDir()
	if err := sys.Mknod(filepath.Join(dev, "null"), syscall.S_IFCHR|0o666, 1, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := BuildState(ctx, dev, filepath.Join(t.TempDir(), "out")); errdefs.CodeOf(err) != "device_node" {
		t.Errorf("a state layer with /dev/null: %v, want device_node", err)
	}
	blk := t.TempDir()
	if err := sys.Mknod(filepath.Join(blk, "b"), syscall.S_IFBLK, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := BuildState(ctx, blk, filepath.Join(t.TempDir(), "out")); errdefs.CodeOf(err) != "device_node" {
		t.Errorf("a state layer with a block device 0/0: %v, want device_node", err)
	}
}

// TestBuildStateMounts: a state layer mounted as an overlay's top lower
// over a base hides what the sandbox deleted (whiteout), shows an opaque
// directory with only its own entries, and keeps modification times,
// owners, modes, symlinks, hard links and xattrs as they were.
func TestBuildStateMounts(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	mustWrite(t, filepath.Join(base, "gone"), []byte("deleted by the sandbox"), 0o644)
	mustWrite(t, filepath.Join(base, "opq", "old"), []byte("hidden by the opaque dir"), 0o644)
	mustWrite(t, filepath.Join(base, "kept"), []byte("from the base"), 0o644)

	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "opq", "new"), []byte("the sandbox's"), 0o640)
	if err := sys.SetXattr(filepath.Join(src, "opq"), "trusted.overlay.opaque", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := sys.Mknod(filepath.Join(src, "gone"), syscall.S_IFCHR, 0, 0); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "work", "a.o"), []byte("object"), 0o4755)
	if err := os.Chown(filepath.Join(src, "work", "a.o"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "work", "a.o"), filepath.Join(src, "work", "b.o")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.o", filepath.Join(src, "work", "ln")); err != nil {
		t.Fatal(err)
	}
	if err := sys.SetXattr(filepath.Join(src, "work", "a.o"), "user.build", []byte("42")); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2026, 3, 4, 5, 6, 7, 890123456, time.UTC)
	if err := os.Chtimes(filepath.Join(src, "work", "a.o"), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, src)
	a, err := BuildState(ctx, src, filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(ctx, a); err != nil {
		t.Fatalf("the state layer does not validate: %v", err)
	}
	mnt := mountLayer(t, a)
	got := snapshot(t, mnt)
	diffTrees(t, want, got)
	if got["gone"].Type != "c" || got["gone"].Target != "0" {
		t.Errorf("the whiteout in the layer: %+v", got["gone"])
	}
	if fi, err := os.Stat(filepath.Join(mnt, "work", "a.o")); err != nil || !fi.ModTime().Equal(mtime) {
		t.Errorf("modification time in the layer: %v, %v, want %v", fi, err, mtime)
	}

	// As an overlay's lower over the base, as a fork's child sees it.
	root, upper, work := t.TempDir(), t.TempDir(), t.TempDir()
	if err := sys.MountOverlay(root, []string{mnt, base}, upper, work); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sys.Unmount(root); err != nil {
			t.Errorf("unmount: %v", err)
		}
	}()
	if _, err := os.Lstat(filepath.Join(root, "gone")); !os.IsNotExist(err) {
		t.Errorf("a deleted file shows through the overlay: %v", err)
	}
	if names := dirNames(t, filepath.Join(root, "opq")); len(names) != 1 || names[0] != "new" {
		t.Errorf("the opaque directory holds %q, want only new", names)
	}
	if b, err := os.ReadFile(filepath.Join(root, "kept")); err != nil || string(b) != "from the base" {
		t.Errorf("kept: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "work", "ln")); err != nil || string(b) != "object" {
		t.Errorf("through the symlink: %q, %v", b, err)
	}
}
