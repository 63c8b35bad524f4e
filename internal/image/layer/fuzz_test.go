package layer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestParseSuperblock(t *testing.T) {
	a := buildSmallTar(t)
	b := mustRead(t, filepath.Join(a.Dir, MetaFile))
	sb, err := ParseSuperblock(b)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ExtraDevices != 1 || len(sb.Devices) != 1 || sb.BlockSize() != blockSize || sb.RootNID == 0 {
		t.Errorf("go-erofs superblock %+v", sb)
	}
	if want := uint32(a.Manifest.Blob.Size / blockSize); sb.Devices[0].Blocks != want {
		t.Errorf("device slot has %d blocks, blob %d", sb.Devices[0].Blocks, want)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"short", b[:1100]},
		{"zeros", make([]byte, 4096)},
		{"bad-block-size", func() []byte { c := bytes.Clone(b); c[erofsSuperOffset+12] = 20; return c }()},
		{"devices-past-end", func() []byte { c := bytes.Clone(b[:2048]); c[erofsSuperOffset+86] = 200; return c }()},
		{"device-table-missing", func() []byte {
			c := bytes.Clone(b)
			c[erofsSuperOffset+80] &^= incompatDeviceTbl
			return c
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseSuperblock(tc.b); err == nil {
				t.Error("accepted")
			}
		})
	}
}

// FuzzSuperblock: the parser never panics, and what it accepts is
// consistent.
func FuzzSuperblock(f *testing.F) {
	a := buildSmallTar(f)
	meta := mustRead(f, filepath.Join(a.Dir, MetaFile))
	f.Add(meta[:4096])
	if _, err := exec.LookPath("mkfs.erofs"); err == nil {
		d, err := BuildDir(context.Background(), f.TempDir(), f.TempDir(), BuildOptions{})
		if err == nil {
			f.Add(mustRead(f, filepath.Join(d.Dir, MetaFile)))
		}
	}
	f.Add(make([]byte, 1152))
	f.Fuzz(func(t *testing.T, b []byte) {
		sb, err := ParseSuperblock(b)
		if err != nil {
			return
		}
		if sb.BlockBits < minBlockBits || sb.BlockBits > maxBlockBits || len(sb.Devices) != int(sb.ExtraDevices) {
			t.Fatalf("inconsistent superblock accepted: %+v", sb)
		}
	})
}

// FuzzTarReader feeds arbitrary bytes to BuildTar with small limits: it
// never panics or hangs, and every error is classified as Invalid or
// TooLarge (a canceled context aside).
func FuzzTarReader(f *testing.F) {
	for _, seed := range [][]byte{
		// Small seeds: the fuzzer minimizes interesting inputs, which is
		// slow for large ones.
		makeTar(f, dir("etc/", 0o755), file("etc/passwd", 0o644, []byte("root:x:0:0\n")).owned(1, 2),
			file("bin/su", 0o4755, testenv.RandBytes(1, 5000)).withXattrs(map[string]string{"security.capability": string(capV2())}),
			hlink("bin/su2", "bin/su"), symlink("sh", "/bin/busybox"), file("etc/passwd", 0o600, []byte("again"))),
		gz(f, makeTar(f, file("a", 0o644, []byte("x")), symlink("l", "/etc"), hlink("h", "a"))),
		makeTar(f, symlink("l", ".."), file("l/x", 0o644, nil)),
		makeTar(f, file("../x", 0o644, nil)),
		makeTar(f, dir("d/", 0o755).withXattrs(map[string]string{"user.a": "b"}), file("d/.wh.x", 0o644, nil)),
		append(tarHeaderBlock(f, "f", []byte("77777777777\x00")), make([]byte, 1024)...),
		nil,
	} {
		f.Add(seed)
	}
	if os.Getenv("DSEC_FUZZ_NOFSCK") != "" {
		f.Setenv("PATH", f.TempDir()) // faster iterations: skip fsck.erofs
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out := t.TempDir()
		_, err := BuildTar(ctx, bytes.NewReader(b), out, BuildOptions{MaxBytes: 4 << 20, MaxEntries: 1000})
		if ctx.Err() != nil {
			t.Fatalf("BuildTar took more than 30 s on %d bytes", len(b))
		}
		if err != nil && !errors.Is(err, errdefs.Invalid) && !errors.Is(err, errdefs.TooLarge) {
			t.Fatalf("unclassified error %s/%s: %v", errdefs.ClassOf(err), errdefs.CodeOf(err), err)
		}
		if err != nil && len(dirNames(t, out)) != 0 {
			t.Fatalf("failed build left %q", dirNames(t, out))
		}
	})
}
