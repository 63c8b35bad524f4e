package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestEtcFilesReplaced checks how the setup writes /etc/hosts,
// /etc/resolv.conf and /etc/hostname into an image that has them: a
// regular file gets the sandbox's content, and a symlink is replaced, not
// followed, even one that names a host path the setup (which runs before
// pivot_root) could reach.
func TestEtcFilesReplaced(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	w := world.get(t)
	victim := filepath.Join(dir, "victim")
	etc, err := buildTreeLayer(ctx, w, func(tree string) error {
		if err := os.MkdirAll(filepath.Join(tree, "etc"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tree, "etc/hosts"), []byte("10.9.9.9 image-hosts-file\n"), 0o644); err != nil {
			return err
		}
		if err := os.Symlink(victim, filepath.Join(tree, "etc/resolv.conf")); err != nil {
			return err
		}
		// The control: the same link where the setup writes nothing.
		return os.Symlink(victim, filepath.Join(tree, "etc/motd"))
	})
	if err != nil {
		t.Fatal(err)
	}
	img := sandbox.Image{ID: "busybox-etc", Name: "busybox-etc", Layers: []layerspec.Layer{w.busybox[0], etc, w.busybox[1]}}
	sb, err := rt.Create(ctx, sandbox.Spec{ID: "etc", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	run := func(script string) string {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sh", "-c", script}}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %v %+v", script, err, res)
		}
		return res.Stdout
	}
	if got := run("readlink /etc/motd"); strings.TrimSpace(got) != victim {
		t.Fatalf("control: /etc/motd links to %q, want %q", got, victim)
	}
	if got := run("cat /etc/hosts"); strings.Contains(got, "image-hosts-file") || !strings.Contains(got, "localhost") {
		t.Errorf("/etc/hosts is the image's, not the sandbox's:\n%s", got)
	}
	if got := run("test -L /etc/resolv.conf && echo link || echo file"); strings.TrimSpace(got) != "file" {
		t.Errorf("/etc/resolv.conf is still a %s", got)
	}
	if _, err := os.Lstat(victim); !os.IsNotExist(err) {
		t.Errorf("the setup wrote through the image's symlink to the host: %s (%v)", victim, err)
	}
}
