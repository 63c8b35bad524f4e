package lazyblob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/image/blobstore"
	"github.com/dsec-dev/dsec/internal/image/chunks"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// requireHost skips a test that cannot run here: it mounts (root), builds
// layers (mkfs.erofs) and serves FUSE (/dev/fuse).
func requireHost(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (FUSE and EROFS mounts)")
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skipf("could not find mkfs.erofs (Debian erofs-utils): %v", err)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("the kernel has no FUSE: %v", err)
	}
}

// leakCheck returns a directory for the test's files and mounts, and
// checks when the test ends (after its other cleanups) that nothing is
// mounted under it and no goroutine it started is left.
func leakCheck(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	base := testenv.Goroutines()
	t.Cleanup(func() {
		testenv.NoMountsUnder(t, root)
		testenv.GoroutinesSettle(t, base)
	})
	return root
}

// mkdir creates dir/name and returns its path.
func mkdir(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// makeTree writes the test's layer source at dir: nested directories, an
// empty one, some hundred files of varied sizes (empty, small, around
// and above a chunk, two identical), symlinks, and varied modes; about
// 10 MiB.
func makeTree(t testing.TB, dir string) {
	t.Helper()
	write := func(rel string, b []byte, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	write("small.txt", []byte("hello, lazy layer\n"), 0o644)
	write("empty", nil, 0o600)
	write("a/empty-too", nil, 0o644)
	for i := range 120 {
		size := int(testenv.RandBytes(uint64(i), 2)[0])*97 + int(testenv.RandBytes(uint64(i), 2)[1])%7
		mode := []os.FileMode{0o644, 0o600, 0o755, 0o640, 0o444}[i%5]
		write(fmt.Sprintf("%s/f%03d", []string{"a", "a/b", "a/b/c", "d"}[i%4], i), testenv.RandBytes(uint64(100+i), size), mode)
	}
	write("big/one-chunk", testenv.RandBytes(1, 1<<20), 0o644)
	write("big/one-and-a-half", testenv.RandBytes(2, 3<<19), 0o644)
	write("big/two-and-a-bit", testenv.RandBytes(3, 2<<20+123), 0o755)
	write("big/three-and-a-bit", testenv.RandBytes(4, 3<<20+7), 0o644)
	write("big/copy-of-two", testenv.RandBytes(3, 2<<20+123), 0o644)
	if err := os.Mkdir(filepath.Join(dir, "empty-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"link-to-small": "small.txt",
		"a/b/up":        "../../big/one-chunk",
		"abs":           "/etc/hostname",
		"dangling":      "nowhere",
		"dir-link":      "a/b",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
}

// testLayer is a layer built from makeTree's tree, its blob in a local
// store.
type testLayer struct {
	meta, blob string // the artifact's files
	store      *blobstore.Local
	idx        chunks.Index
}

// treeLayer is most tests' start: the host checked, a directory checked
// for leftovers at the end (leakCheck), makeTree's tree in root/src and
// the layer built from it.
func treeLayer(t testing.TB) (root, src string, l testLayer) {
	t.Helper()
	requireHost(t)
	root = leakCheck(t)
	src = mkdir(t, root, "src")
	makeTree(t, src)
	return root, src, buildLayer(t, root, src)
}

// buildLayer builds a layer from src and stores its blob.
func buildLayer(t testing.TB, root, src string) testLayer {
	t.Helper()
	a, err := layer.BuildDir(context.Background(), src, mkdir(t, root, "artifact"), layer.BuildOptions{})
	if err != nil {
		t.Fatalf("building the layer: %v", err)
	}
	st, err := blobstore.NewLocal(mkdir(t, root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	l := testLayer{meta: filepath.Join(a.Dir, layer.MetaFile), blob: filepath.Join(a.Dir, layer.BlobFile), store: st}
	l.idx = storeFile(t, st, l.blob)
	if l.idx.Digest != a.Manifest.Blob.Digest {
		t.Fatalf("index digest %s, manifest's %s", l.idx.Digest, a.Manifest.Blob.Digest)
	}
	return l
}

// mountServer mounts a Server; the test's cleanup closes it.
func mountServer(t testing.TB, opt Options) *Server {
	t.Helper()
	s, err := Mount(context.Background(), opt)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// mountErofs mounts an EROFS layer; the test's cleanup unmounts it.
func mountErofs(t testing.TB, meta, blob, target string) {
	t.Helper()
	if err := sys.MountErofs(meta, blob, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sys.Unmount(target); err != nil {
			t.Errorf("unmounting %s: %v", target, err)
		}
	})
}

// mountLazyErofs mounts an EROFS layer over a blob file as the node's
// layer cache does (ReadaheadKB); the test's cleanup unmounts it.
func mountLazyErofs(t testing.TB, meta, blob, target string) {
	t.Helper()
	tuned, err := sys.MountErofsReadahead(meta, blob, target, ReadaheadKB)
	if err != nil {
		t.Fatal(err)
	}
	if !tuned {
		t.Logf("the readahead of %s was left as it was (another EROFS mount at the same moment)", target)
	}
	t.Cleanup(func() {
		if err := sys.Unmount(target); err != nil {
			t.Errorf("unmounting %s: %v", target, err)
		}
	})
}

// entry is what a tree comparison looks at of one path.
type treeEntry struct {
	Type   string // "f", "d" or "l"
	Mode   fs.FileMode
	Size   int64
	SHA    string   // a file's content
	Target string   // a symlink's
	Names  []string // a directory's entries
}

// snapshot reads every entry of the tree at root, content included.
func snapshot(t testing.TB, root string) map[string]treeEntry {
	t.Helper()
	out := map[string]treeEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e := treeEntry{Mode: fi.Mode()}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			e.Type, e.Size, e.SHA = "f", int64(len(b)), hex.EncodeToString(sum[:])
		case fi.IsDir():
			e.Type = "d"
			ents, err := os.ReadDir(p)
			if err != nil {
				return err
			}
			for _, de := range ents {
				e.Names = append(e.Names, de.Name())
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Type = "l"
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected file type %v at %s", fi.Mode(), rel)
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("reading the tree at %s: %v", root, err)
	}
	return out
}

// readWithin reads the file at p in a goroutine and waits at most d for
// it: a read that hangs fails the test instead of hanging it.
func readWithin(t testing.TB, p string, d time.Duration) ([]byte, error) {
	t.Helper()
	return within(t, p, d, func() ([]byte, error) { return os.ReadFile(p) })
}

// within runs read, a read of the file at p, in a goroutine and waits
// at most d for it.
func within(t testing.TB, p string, d time.Duration, read func() ([]byte, error)) ([]byte, error) {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		b, err := read()
		ch <- result{b, err}
	}()
	r := testenv.Recv(t, ch, d, "a read of "+p)
	return r.b, r.err
}
