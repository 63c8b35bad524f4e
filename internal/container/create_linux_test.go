package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestCreateRefusesSocketPathTooLong checks that an ID too long for the
// node's state directory (its agent's socket path would not fit in a
// unix socket address) is refused up front, with nothing left behind.
func TestCreateRefusesSocketPathTooLong(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	id := strings.Repeat("x", 64)
	if len(filepath.Join(dir, "sandboxes", id, "sock", "agent.sock")) < maxSockPath {
		t.Skipf("the temporary directory %s is too short for the test", dir)
	}
	_, err := rt.Create(context.Background(), sandbox.Spec{ID: id, Image: w.image()})
	if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != "sandbox_id_too_long" {
		t.Fatalf("create with a 64-byte ID in %s: %v, want Invalid sandbox_id_too_long", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused sandbox's directory: %v", err)
	}
}
