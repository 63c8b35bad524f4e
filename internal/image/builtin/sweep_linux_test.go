package builtin

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/sys"
)

// TestSweep: Sweep removes the temporary tree of a build no process runs,
// first detaching the host's proc that a build by an older dsec, killed
// mid-way, left mounted in it (and not walking into it), and leaves a
// build whose lock is held alone.
func TestSweep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts proc: needs root")
	}
	cache := t.TempDir()
	parent := filepath.Join(cache, "base", "debian-12")
	dead := filepath.Join(parent, ".2026.01.01.tmp-123", "tree")
	live := filepath.Join(parent, ".2026.01.02.tmp-456", "tree")
	for _, d := range []string{filepath.Join(dead, "proc"), live} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("mount", "-t", "proc", "proc", filepath.Join(dead, "proc")).CombinedOutput(); err != nil {
		t.Fatalf("mounting proc: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = sys.DetachMount(filepath.Join(dead, "proc")) })
	unlock, err := sys.LockFile(context.Background(), filepath.Join(parent, "2026.01.02.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()

	if err := Sweep(cache, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(dead)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the interrupted build's tree: %v, want it removed", err)
	}
	if m, _ := sys.MountsUnder(cache); len(m) > 0 {
		t.Errorf("still mounted: %q", m)
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Errorf("the host's /proc: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the tree of a build in progress: %v, want it kept", err)
	}
}
