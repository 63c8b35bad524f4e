package layer

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func nowPlus(s int) time.Time { return time.Now().Add(time.Duration(s) * time.Second) }

// capV2 is a security.capability value (VFS_CAP_REVISION_2) granting
// cap_net_bind_service (bit 10) as effective and permitted.
func capV2() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000001) // revision 2, effective
	binary.LittleEndian.PutUint32(b[4:], 1<<10)      // permitted, low word
	return b
}

// makeTree builds the round-trip source tree under dir.
func makeTree(t testing.TB, dir string) {
	t.Helper()
	w := func(rel string, b []byte, mode os.FileMode, uid, gid int) {
		p := filepath.Join(dir, rel)
		mustWrite(t, p, b, mode)
		if err := os.Lchown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // chown drops setuid
			t.Fatal(err)
		}
	}
	w("empty", nil, 0o644, 0, 0)
	w("small.txt", []byte("hello, layer\n"), 0o600, 1000, 1000)
	w("mid.bin", testenv.RandBytes(1, 3000), 0o644, 65534, 65534)
	w("big.bin", testenv.RandBytes(2, 1<<20+12345), 0o644, 100000, 100001)
	w("five.bin", testenv.RandBytes(3, 5<<20), 0o755, 0, 0)
	w("five-copy.bin", testenv.RandBytes(3, 5<<20), 0o644, 0, 0) // same chunks as five.bin
	w("bin/su", testenv.RandBytes(4, 700), 0o4755|os.ModeSetuid, 0, 0)
	w("bin/newgrp", testenv.RandBytes(5, 700), 0o2755|os.ModeSetgid, 0, 42)
	w("a/b/c/deep.txt", []byte("deep\n"), 0o640, 7, 8)
	if err := os.Chmod(filepath.Join(dir, "bin/su"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "bin/newgrp"), 0o755|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		rel  string
		mode os.FileMode
	}{{"tmp", 0o777 | os.ModeSticky}, {"emptydir", 0o700}, {"shared", 0o755 | os.ModeSetgid}} {
		p := filepath.Join(dir, d.rel)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(filepath.Join(dir, "shared"), 3, 4); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ target, name string }{
		{"../small.txt", "a/rel-link"},
		{"/etc/passwd", "abs-link"},
		{"no/such/file", "dangling"},
	} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(filepath.Join(dir, "dangling"), 5, 6); err != nil {
		t.Fatal(err)
	}
	w("hl-one", []byte("linked content\n"), 0o644, 0, 0)
	if err := os.Link(filepath.Join(dir, "hl-one"), filepath.Join(dir, "a/b/hl-two")); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct{ rel, name, value string }{
		{"small.txt", "user.comment", "a comment"},
		{"emptydir", "user.dir", "on a directory"},
		{"mid.bin", "user.empty", ""},
		{"mid.bin", "trusted.note", "trusted value"},
	} {
		if err := sys.SetXattr(filepath.Join(dir, x.rel), x.name, []byte(x.value)); err != nil {
			t.Fatal(err)
		}
	}
	// Several xattrs per file, set out of order, and one pair shared by
	// many files (mkfs.erofs moves those to its shared xattr area).
	for i, rel := range []string{"multi/x1", "multi/x2", "multi/x3", "multi/x4", "multi/x5"} {
		w(rel, []byte{byte(i)}, 0o644, 0, 0)
		for _, x := range [][2]string{{"user.zz", "last"}, {"trusted.mid", string(rune('a' + i))}, {"user.shared", "same everywhere"}, {"user.aa", "first"}} {
			if err := sys.SetXattr(filepath.Join(dir, rel), x[0], []byte(x[1])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sys.SetXattr(filepath.Join(dir, "five.bin"), "security.capability", capV2()); err != nil {
		t.Logf("security.capability not settable here: %v", err)
	}
}

func TestBuildDirRoundTrip(t *testing.T) {
	requireRoot(t)
	requireMkfs(t)
	ctx := context.Background()
	src := t.TempDir()
	makeTree(t, src)
	a, err := BuildDir(ctx, src, filepath.Join(t.TempDir(), "out"), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := a.Manifest
	if m.Builder.Name != "mkfs.erofs" || m.Builder.Version == "" || m.Source.Kind != SourceDir {
		t.Errorf("manifest %+v", m)
	}
	if len(m.Builder.Options) == 0 || m.Builder.Options[1] != "-U"+uuidFromDigest(m.Source.Digest) {
		t.Errorf("builder options %q", m.Builder.Options)
	}
	want := snapshot(t, src)
	if _, ok := want["five.bin"].Xattrs["security.capability"]; !ok {
		t.Log("no security.capability in the source; checking the rest")
	}
	diffTrees(t, want, snapshot(t, mountLayer(t, a)))
	// Chunk dedup: five-copy.bin adds no blob data.
	if n := m.Blob.Size; n > 11<<20 {
		t.Errorf("blob is %d bytes; duplicate chunks were not shared", n)
	}
	checkUnchanged(t, a)
}

func TestBuildDirReproducible(t *testing.T) {
	requireRoot(t)
	requireMkfs(t)
	ctx := context.Background()
	src1, src2 := t.TempDir(), filepath.Join(t.TempDir(), "elsewhere")
	makeTree(t, src1)
	if err := os.Mkdir(src2, 0o755); err != nil {
		t.Fatal(err)
	}
	copyTree(t, src1, src2)
	a1, err := BuildDir(ctx, src1, t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := BuildDir(ctx, src2, t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a1.ID() != a2.ID() || a1.Manifest.Meta != a2.Manifest.Meta || a1.Manifest.Blob != a2.Manifest.Blob {
		t.Fatalf("copies build differently:\n%+v\n%+v", a1.Manifest, a2.Manifest)
	}
	// One byte changed: a different layer.
	p := filepath.Join(src2, "a/b/c/deep.txt")
	if err := os.WriteFile(p, []byte("deeP\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	a3, err := BuildDir(ctx, src2, t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a3.ID() == a1.ID() || a3.Manifest.Source.Digest == a1.Manifest.Source.Digest {
		t.Fatal("a changed byte did not change the layer")
	}
	// So does a changed owner, mode or xattr.
	for _, change := range []func() error{
		func() error { return os.Lchown(p, 1, 1) },
		func() error { return os.Chmod(p, 0o600) },
		func() error { return sys.SetXattr(p, "user.new", []byte("x")) },
	} {
		before, err := TreeDigest(ctx, src2)
		if err != nil {
			t.Fatal(err)
		}
		if err := change(); err != nil {
			t.Fatal(err)
		}
		after, err := TreeDigest(ctx, src2)
		if err != nil {
			t.Fatal(err)
		}
		if before == after {
			t.Error("a metadata change did not change the tree digest")
		}
	}
}

func TestBuildDirRefusals(t *testing.T) {
	requireRoot(t)
	requireMkfs(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		mode uint32
		code string
	}{
		{"char", sys.ModeChar | 0o666, "device_node"},
		{"block", sys.ModeBlock | 0o660, "device_node"},
		{"fifo", sys.ModeFifo | 0o644, "special_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := t.TempDir()
			mustWrite(t, filepath.Join(src, "ok"), []byte("x"), 0o644)
			if err := sys.Mknod(filepath.Join(src, "dev", tc.name), tc.mode, 1, 3); err != nil {
				if err := os.MkdirAll(filepath.Join(src, "dev"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := sys.Mknod(filepath.Join(src, "dev", tc.name), tc.mode, 1, 3); err != nil {
					t.Fatal(err)
				}
			}
			out := filepath.Join(t.TempDir(), "out")
			_, err := BuildDir(ctx, src, out, BuildOptions{})
			testenv.WantError(t, err, errdefs.Invalid, tc.code)
			if n := dirNames(t, out); len(n) != 0 {
				t.Errorf("failed build left %q", n)
			}
		})
	}
	t.Run("not-empty-out", func(t *testing.T) {
		out := t.TempDir()
		mustWrite(t, filepath.Join(out, "junk"), nil, 0o644)
		_, err := BuildDir(ctx, t.TempDir(), out, BuildOptions{})
		testenv.WantError(t, err, errdefs.Conflict, "layer_out_dir_not_empty")
	})
	t.Run("out-inside-src", func(t *testing.T) {
		src := t.TempDir()
		_, err := BuildDir(ctx, src, filepath.Join(src, "new", "out"), BuildOptions{})
		testenv.WantError(t, err, errdefs.Invalid, "layer_out_dir")
		if n := dirNames(t, src); len(n) != 0 {
			t.Errorf("the source gained %q", n)
		}
	})
	t.Run("missing-src", func(t *testing.T) {
		_, err := BuildDir(ctx, filepath.Join(t.TempDir(), "nope"), t.TempDir(), BuildOptions{})
		testenv.WantError(t, err, errdefs.NotFound, "layer_source_not_found")
	})
	t.Run("empty-src", func(t *testing.T) {
		a, err := BuildDir(ctx, t.TempDir(), t.TempDir(), BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a.Manifest.Blob.Size != 0 {
			t.Errorf("empty tree has a %d-byte blob", a.Manifest.Blob.Size)
		}
		if n := dirNames(t, mountLayer(t, a)); len(n) != 0 {
			t.Errorf("empty layer shows %q", n)
		}
	})
}
