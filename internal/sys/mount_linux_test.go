package sys

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// mkfs builds a chunked EROFS layer (meta + blob) from dir.
func mkfs(t *testing.T, dir string) (meta, blob string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	bin, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		t.Skipf("could not find mkfs.erofs (Debian erofs-utils): %v", err)
	}
	out := t.TempDir()
	meta, blob = filepath.Join(out, "meta.erofs"), filepath.Join(out, "data.blob")
	if b, err := exec.Command(bin, "--quiet", "-T0", "--chunksize=1048576", "--blobdev="+blob, meta, dir).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, b)
	}
	return meta, blob
}

func TestMountErofsAndOverlay(t *testing.T) {
	base, top := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("from base"), 0o644)
	os.WriteFile(filepath.Join(base, "shadowed.txt"), []byte("base"), 0o644)
	os.WriteFile(filepath.Join(top, "shadowed.txt"), []byte("top"), 0o644)
	m1, b1 := mkfs(t, base)
	m2, b2 := mkfs(t, top)
	root := t.TempDir()
	l1, l2, ro, rw := filepath.Join(root, "l1"), filepath.Join(root, "l2"), filepath.Join(root, "ro"), filepath.Join(root, "rw")
	upper, work := filepath.Join(root, "upper"), filepath.Join(root, "work")
	for _, d := range []string{l1, l2, ro, rw, upper, work} {
		os.Mkdir(d, 0o755)
	}
	if err := MountErofs(m1, b1, l1); err != nil {
		t.Fatal(err)
	}
	defer Unmount(l1)
	if err := MountErofs(m2, b2, l2); err != nil {
		t.Fatal(err)
	}
	defer Unmount(l2)
	if b, err := os.ReadFile(filepath.Join(l1, "a.txt")); err != nil || string(b) != "from base" {
		t.Fatalf("read through erofs: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(l1, "x"), nil, 0o644); err == nil {
		t.Error("an erofs mount is writable")
	}
	if err := MountOverlay(ro, []string{l2, l1}, "", ""); err != nil {
		t.Fatal(err)
	}
	defer Unmount(ro)
	if b, _ := os.ReadFile(filepath.Join(ro, "shadowed.txt")); string(b) != "top" {
		t.Errorf("upper layer does not win: %q", b)
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); err == nil {
		t.Error("a read-only overlay is writable")
	}
	if err := MountOverlay(rw, []string{l2, l1}, upper, work); err != nil {
		t.Fatal(err)
	}
	defer Unmount(rw)
	if err := os.WriteFile(filepath.Join(rw, "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(upper, "a.txt")); string(b) != "changed" {
		t.Errorf("write did not land in the upper dir: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(l1, "a.txt")); string(b) != "from base" {
		t.Errorf("the layer changed: %q", b)
	}
	got, err := MountsUnder(root)
	if err != nil || !slices.Equal(got, []string{l1, l2, ro, rw}) {
		t.Errorf("MountsUnder = %q, %v", got, err)
	}
	if err := MountOverlay(rw, []string{"a:b"}, "", ""); err == nil {
		t.Error("a lower with ':' was accepted")
	}
}

// TestMountErofsReadahead: the mount's own backing-device info, and no
// other, gets the readahead asked for.
func TestMountErofsReadahead(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("a"), 0o644)
	meta, blob := mkfs(t, src)
	target := filepath.Join(t.TempDir(), "l")
	os.Mkdir(target, 0o755)
	before := erofsBDIs()
	ra := func(name string) string {
		b, _ := os.ReadFile(filepath.Join("/sys/class/bdi", name, "read_ahead_kb"))
		return string(b)
	}
	was := map[string]string{}
	for name := range before {
		was[name] = ra(name)
	}
	tuned, err := MountErofsReadahead(meta, blob, target, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmount(target)
	if !tuned {
		t.Skip("another process mounted an EROFS at the same moment: the mount's readahead cannot be told (not a fault)")
	}
	var added []string
	for name := range erofsBDIs() {
		switch got := ra(name); {
		case !before[name]:
			added = append(added, name)
			if got != "1024\n" {
				t.Errorf("the new mount's readahead is %q KiB, want 1024", got)
			}
		case got != was[name]:
			t.Errorf("%s, an earlier mount's, was changed too: %q, was %q", name, got, was[name])
		}
	}
	if len(added) != 1 {
		t.Errorf("new EROFS backing-device infos: %q, want one", added)
	}
	if b, err := os.ReadFile(filepath.Join(target, "a.txt")); err != nil || string(b) != "a" {
		t.Errorf("read through the mount: %q, %v", b, err)
	}
}
