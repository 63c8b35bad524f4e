package layer

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

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
