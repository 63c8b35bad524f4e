package layer

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func buildSmallTar(t testing.TB) Artifact {
	t.Helper()
	a, err := BuildTar(context.Background(), bytes.NewReader(makeTar(t,
		file("a", 0o644, testenv.RandBytes(31, 100000)),
		dir("d/", 0o755),
		file("d/b", 0o600, []byte("b\n")),
	)), t.TempDir(), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// rewrite applies edit to one of the artifact's files and, with
// rehash, records the new digest in the manifest so that only the later
// checks can catch the change.
func rewrite(t testing.TB, a *Artifact, name string, rehash bool, edit func([]byte) []byte) {
	t.Helper()
	p := filepath.Join(a.Dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b = edit(b)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if rehash {
		ref, err := hashFile(p)
		if err != nil {
			t.Fatal(err)
		}
		switch name {
		case MetaFile:
			a.Manifest.Meta = ref
		case ChunksFile:
			a.Manifest.Chunks = ref
		default:
			a.Manifest.Blob = ref
		}
	}
}

// setDevices patches extra_devices and the checksum, if any.
func setDevices(n uint16) func([]byte) []byte {
	return func(b []byte) []byte {
		binary.LittleEndian.PutUint16(b[erofsSuperOffset+86:], n)
		if binary.LittleEndian.Uint32(b[erofsSuperOffset+8:])&compatSBChecksum != 0 {
			sb, _ := ParseSuperblock(b) // reads the block size only
			binary.LittleEndian.PutUint32(b[erofsSuperOffset+4:], superblockChecksum(b[:sb.BlockSize()]))
		}
		return b
	}
}

func TestValidate(t *testing.T) {
	ctx := context.Background()
	t.Run("ok", func(t *testing.T) {
		a := buildSmallTar(t)
		c, err := CheckArtifact(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := exec.LookPath("fsck.erofs"); err == nil && c.Fsck != "passed" {
			t.Errorf("fsck %q", c.Fsck)
		}
	})
	t.Run("fsck-missing-is-a-skip", func(t *testing.T) {
		a := buildSmallTar(t)
		t.Setenv("PATH", t.TempDir())
		c, err := CheckArtifact(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if c.Fsck != "skipped: fsck.erofs not found" {
			t.Errorf("fsck %q", c.Fsck)
		}
	})
	t.Run("tampered-blob", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, BlobFile, false, func(b []byte) []byte { b[1000] ^= 1; return b })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_digest_mismatch")
	})
	t.Run("truncated-blob", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, BlobFile, false, func(b []byte) []byte { return b[:len(b)-blockSize] })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_digest_mismatch")
	})
	// The chunk index is what a lazy node checks every chunk against: it
	// must be the manifest's and index the blob.
	t.Run("chunk-index-listed", func(t *testing.T) {
		a := buildSmallTar(t)
		if !a.Manifest.HasChunks() {
			t.Fatalf("a built layer has no chunk index: %+v", a.Manifest)
		}
		b, err := os.ReadFile(filepath.Join(a.Dir, ChunksFile))
		if err != nil {
			t.Fatal(err)
		}
		idx, err := chunks.Parse(b)
		if err != nil || idx.Digest != a.Manifest.Blob.Digest || idx.Size != a.Manifest.Blob.Size || len(idx.Chunks) == 0 {
			t.Errorf("chunk index %+v (%v) of blob %+v", idx, err, a.Manifest.Blob)
		}
	})
	t.Run("tampered-chunk-index", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, ChunksFile, false, func(b []byte) []byte { return append(b, ' ') })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_digest_mismatch")
	})
	t.Run("chunk-index-of-other-data", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, ChunksFile, true, func(b []byte) []byte {
			i := bytes.Index(b, []byte(`"chunks":["sha256:`)) + len(`"chunks":["sha256:`)
			if b[i] == '0' { // another hex digit: a valid index of other data
				b[i] = '1'
			} else {
				b[i] = '0'
			}
			return b
		})
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_chunks")
	})
	t.Run("chunk-index-garbage", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, ChunksFile, true, func([]byte) []byte { return []byte("{}") })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_chunks")
	})
	t.Run("tampered-meta", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, MetaFile, false, func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_digest_mismatch")
	})
	t.Run("bad-magic", func(t *testing.T) {
		a := buildSmallTar(t)
		rewrite(t, &a, MetaFile, true, func(b []byte) []byte { b[erofsSuperOffset] ^= 1; return b })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_bad_superblock")
	})
	for _, n := range []uint16{0, 2} {
		t.Run("go-erofs-devices-"+string(rune('0'+n)), func(t *testing.T) {
			a := buildSmallTar(t)
			rewrite(t, &a, MetaFile, true, setDevices(n))
			testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_devices")
		})
	}
	t.Run("corrupt-inode", func(t *testing.T) {
		if _, err := exec.LookPath("fsck.erofs"); err != nil {
			t.Skipf("no fsck.erofs: %v", err)
		}
		a := buildSmallTar(t)
		rewrite(t, &a, MetaFile, true, func(b []byte) []byte {
			img, err := openErofs(bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			root := img.metaBase + int64(img.sb.RootNID)*32
			for i := range 32 {
				b[root+int64(i)] = 0xff
			}
			return b
		})
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_fsck")
	})
}

func TestValidateMkfs(t *testing.T) {
	requireMkfs(t)
	ctx := context.Background()
	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "f"), testenv.RandBytes(41, 3<<20), 0o644)
	for _, n := range []uint16{0, 2} {
		t.Run("devices-"+string(rune('0'+n)), func(t *testing.T) {
			a, err := BuildDir(ctx, src, t.TempDir(), BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rewrite(t, &a, MetaFile, true, setDevices(n))
			if _, err := ParseSuperblock(mustRead(t, filepath.Join(a.Dir, MetaFile))); err != nil {
				t.Fatalf("patched superblock does not parse: %v", err)
			}
			testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_devices")
		})
	}
	t.Run("single-device-image", func(t *testing.T) {
		a, err := BuildDir(ctx, src, t.TempDir(), BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The same tree as one self-contained image (no --blobdev).
		single := filepath.Join(t.TempDir(), "single.erofs")
		if out, err := exec.Command("mkfs.erofs", "--quiet", "-T0", "--chunksize=1048576", single, src).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.erofs: %v\n%s", err, out)
		}
		rewrite(t, &a, MetaFile, true, func([]byte) []byte { return mustRead(t, single) })
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_devices")
	})
	t.Run("bad-checksum", func(t *testing.T) {
		a, err := BuildDir(ctx, src, t.TempDir(), BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rewrite(t, &a, MetaFile, true, func(b []byte) []byte { b[erofsSuperOffset+16] ^= 1; return b }) // inos
		testenv.WantError(t, Validate(ctx, a), errdefs.Invalid, "layer_bad_superblock")
	})
}

func TestLoad(t *testing.T) {
	_, err := Load(t.TempDir())
	testenv.WantError(t, err, errdefs.NotFound, "layer_not_found")
	d := t.TempDir()
	mustWrite(t, filepath.Join(d, ManifestFile), []byte("{"), 0o644)
	_, err = Load(d)
	testenv.WantError(t, err, errdefs.Invalid, "layer_manifest")
	mustWrite(t, filepath.Join(d, ManifestFile), []byte(`{"media_type":"x"}`), 0o644)
	_, err = Load(d)
	testenv.WantError(t, err, errdefs.Invalid, "layer_manifest")
}

func mustRead(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
