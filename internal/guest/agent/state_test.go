//go:build linux

package agent_test

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
)

// TestStateListAndRead: an agent handed an upper directory announces
// CapState, lists it (whiteouts, symlinks with their targets, opaque
// directories, each directory before what it holds) and streams its
// regular files by path, never through a symlink, whatever a guest
// process planted. (Freezing is left to the VM tests: here it would
// freeze the host's file system.)
func TestStateListAndRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts and trusted xattrs need root")
	}
	upper := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(upper, "d"), 0o755))
	must(os.WriteFile(filepath.Join(upper, "d/f"), []byte("hello"), 0o640))
	must(os.Symlink("/etc", filepath.Join(upper, "esc")))
	must(os.Symlink("..", filepath.Join(upper, "d/up")))
	must(syscall.Mknod(filepath.Join(upper, "gone"), syscall.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(upper, "o"), 0o755))
	must(syscall.Setxattr(filepath.Join(upper, "o"), "trusted.overlay.opaque", []byte("y"), 0))
	dir, err := os.Open(upper)
	must(err)
	c, _ := newAgent(t, agent.Options{Upper: dir})
	if !c.HasCap(agentproto.CapState) {
		t.Fatal("an agent with an upper does not announce CapState")
	}
	ctx := ctxT(t, 30*time.Second)
	list, err := c.StateList(ctx)
	must(err)
	byPath := map[string]agentproto.StateEntry{}
	var order []string
	for _, e := range list {
		byPath[e.Path] = e
		order = append(order, e.Path)
	}
	want := []string{".", "d", "d/f", "d/up", "esc", "gone", "o"}
	if len(order) != len(want) {
		t.Fatalf("listed %q, want %q", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("listed %q, want %q", order, want)
		}
	}
	if e := byPath["d/f"]; e.Mode != syscall.S_IFREG|0o640 || e.Size != 5 || e.Mtime == 0 || e.Ino == 0 {
		t.Errorf("d/f: %+v", e)
	}
	if e := byPath["esc"]; e.Target != "/etc" || e.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		t.Errorf("esc: %+v", e)
	}
	if e := byPath["gone"]; e.Mode&syscall.S_IFMT != syscall.S_IFCHR || e.Rdev != 0 {
		t.Errorf("gone is not a whiteout: %+v", e)
	}
	if !byPath["o"].Opaque || byPath["d"].Opaque {
		t.Errorf("opaque marks: o %+v, d %+v", byPath["o"], byPath["d"])
	}

	read := func(p string) (string, error) {
		r, err := c.StateRead(ctx, p)
		if err != nil {
			return "", err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		return string(b), err
	}
	if got, err := read("d/f"); err != nil || got != "hello" {
		t.Errorf("read d/f: %q, %v", got, err)
	}
	for _, p := range []string{"esc/passwd", "d/up/d/f", "esc", "d", "gone", "../etc/passwd", "/etc/passwd", "d/../d/f", ".", ""} {
		if got, err := read(p); err == nil {
			t.Errorf("read %q gave %q, want an error", p, got)
		}
	}
	// Thawing what is not frozen does nothing.
	if err := c.Thaw(ctx); err != nil {
		t.Errorf("thaw of an unfrozen upper: %v", err)
	}
}

// TestStateUnsupported: an agent without an upper (a container's, or a
// guest whose upper is a tmpfs) neither announces CapState nor serves
// the state operations.
func TestStateUnsupported(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	if c.HasCap(agentproto.CapState) {
		t.Error("an agent without an upper announces CapState")
	}
	ctx := ctxT(t, 30*time.Second)
	err := c.Freeze(ctx, agentproto.FreezeArgs{})
	if errdefs.CodeOf(err) != api.CodeUnsupportedOnTier {
		t.Errorf("freeze without an upper: %v, want unsupported_on_tier", err)
	}
	if _, err := c.StateList(ctx); errdefs.CodeOf(err) != api.CodeUnsupportedOnTier {
		t.Errorf("state list without an upper: %v, want unsupported_on_tier", err)
	}
}
