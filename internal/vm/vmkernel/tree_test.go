package vmkernel

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestFromTreeStaysInTheImage: an image without a kernel has none, and
// symbolic links out of the image's tree are never followed on the host.
func TestFromTreeStaysInTheImage(t *testing.T) {
	ctx := context.Background()
	cache := t.TempDir()
	root := t.TempDir()
	if _, found, err := FromTree(ctx, cache, root); found || err != nil {
		t.Fatalf("empty tree: found %v, %v", found, err)
	}
	// A kernel that is a link to a host file, with its modules directory.
	host := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(host, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"boot", "lib/modules/6.1.0-x"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(host, filepath.Join(root, "boot", "vmlinuz-6.1.0-x")); err != nil {
		t.Fatal(err)
	}
	if _, found, err := FromTree(ctx, cache, root); found {
		t.Errorf("a kernel linked out of the tree was used (%v)", err)
	}
	// A real file, but modules that link out of the tree.
	os.Remove(filepath.Join(root, "boot", "vmlinuz-6.1.0-x"))
	if err := os.WriteFile(filepath.Join(root, "boot", "vmlinuz-6.1.0-x"), []byte("\x7fELF not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(root, "lib/modules/6.1.0-x/virtio.ko")); err != nil {
		t.Fatal(err)
	}
	_, found, err := FromTree(ctx, cache, root)
	if !found || err == nil {
		t.Errorf("modules linked out of the tree: found %v, err %v; want found and an error", found, err)
	}
}
