package layer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/internal/sys"
)

// requireRoot skips tests that chown, set trusted xattrs or mount.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown, mounts)")
	}
}

// requireMkfs skips tests that need Debian's mkfs.erofs.
func requireMkfs(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skipf("could not find mkfs.erofs (Debian erofs-utils): %v", err)
	}
}

// mountLayer mounts the artifact read-only and unmounts it when the test
// ends, checking that nothing stays mounted.
func mountLayer(t testing.TB, a Artifact) string {
	t.Helper()
	requireRoot(t)
	mnt := t.TempDir()
	if err := sys.MountErofs(filepath.Join(a.Dir, MetaFile), filepath.Join(a.Dir, BlobFile), mnt); err != nil {
		t.Fatalf("mounting the layer: %v", err)
	}
	t.Cleanup(func() {
		if err := sys.Unmount(mnt); err != nil {
			t.Errorf("unmount: %v", err)
		}
		if m, _ := sys.MountsUnder(mnt); len(m) > 0 {
			t.Errorf("mounts left under %s: %q", mnt, m)
		}
	})
	return mnt
}

// snap is what a round trip must preserve of an entry.
type snap struct {
	Type   string // "f", "d", "l" or "c" (Target is then the device number)
	Mode   fs.FileMode
	UID    uint32
	GID    uint32
	Size   int64
	SHA    string
	Target string
	Xattrs map[string]string
	// Link is, for a file that shares its inode with other paths of the
	// tree, the first of those paths; "" otherwise.
	Link string
}

const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// snapshot describes every entry of the tree at root ("" is root itself).
func snapshot(t testing.TB, root string) map[string]snap {
	t.Helper()
	out := map[string]snap{}
	inodes := map[[2]uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			rel = ""
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		s := snap{UID: st.Uid, GID: st.Gid, Mode: fi.Mode() & modeBits}
		switch {
		case fi.Mode().IsRegular():
			s.Type, s.Size = "f", fi.Size()
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			s.SHA = hex.EncodeToString(sum[:])
			k := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
			inodes[k] = append(inodes[k], rel)
		case fi.IsDir():
			s.Type = "d"
		case fi.Mode()&fs.ModeSymlink != 0:
			s.Type, s.Mode = "l", 0
			if s.Target, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeCharDevice != 0: // overlay whiteouts, in state layers
			s.Type, s.Target = "c", fmt.Sprintf("%d", st.Rdev)
		default:
			t.Fatalf("unexpected file type %v at %s", fi.Mode(), rel)
		}
		xs, err := sys.ListXattrs(p)
		if err != nil {
			return err
		}
		for _, x := range xs {
			if s.Xattrs == nil {
				s.Xattrs = map[string]string{}
			}
			s.Xattrs[x.Name] = string(x.Value)
		}
		out[rel] = s
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot of %s: %v", root, err)
	}
	for _, paths := range inodes {
		if len(paths) < 2 {
			continue
		}
		sort.Strings(paths)
		for _, p := range paths {
			s := out[p]
			s.Link = paths[0]
			out[p] = s
		}
	}
	return out
}

func diffTrees(t testing.TB, want, got map[string]snap) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("tree mismatch (-want +got):\n%s", d)
	}
}

// checkUnchanged re-hashes the artifact's files against its manifest.
func checkUnchanged(t testing.TB, a Artifact) {
	t.Helper()
	for _, f := range []struct {
		name string
		want FileRef
	}{{MetaFile, a.Manifest.Meta}, {BlobFile, a.Manifest.Blob}} {
		got, err := hashFile(filepath.Join(a.Dir, f.name))
		if err != nil {
			t.Fatal(err)
		}
		if got != f.want {
			t.Errorf("%s changed: %+v, manifest %+v", f.name, got, f.want)
		}
	}
	l, err := Load(a.Dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if l.ID() != a.ID() {
		t.Errorf("Load: ID %s, built %s", l.ID(), a.ID())
	}
}

// copyTree copies src to dst keeping modes, owners, xattrs, symlinks and
// hard links, creating entries in reverse name order (unlike a plain copy)
// and with different mtimes, so a build that depends on either differs.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	links := map[[2]uint64]string{}
	var rec func(rel string)
	rec = func(rel string) {
		s, d := filepath.Join(src, rel), filepath.Join(dst, rel)
		fi, err := os.Lstat(s)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		switch {
		case fi.IsDir():
			if rel != "" {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			ents, err := os.ReadDir(s)
			if err != nil {
				t.Fatal(err)
			}
			for i := len(ents) - 1; i >= 0; i-- {
				rec(filepath.Join(rel, ents[i].Name()))
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(s)
			if err := os.Symlink(target, d); err != nil {
				t.Fatal(err)
			}
		default:
			k := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
			if first, ok := links[k]; ok {
				if err := os.Link(first, d); err != nil {
					t.Fatal(err)
				}
				return
			}
			links[k] = d
			in, err := os.Open(s)
			if err != nil {
				t.Fatal(err)
			}
			out, err := os.Create(d)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, in); err != nil {
				t.Fatal(err)
			}
			in.Close()
			out.Close()
		}
		if err := os.Lchown(d, int(st.Uid), int(st.Gid)); err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if err := os.Chmod(d, fi.Mode()&modeBits); err != nil {
				t.Fatal(err)
			}
		}
		xs, err := sys.ListXattrs(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range xs {
			if err := sys.SetXattr(d, x.Name, x.Value); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec("")
	if err := os.Chtimes(dst, nowPlus(3600), nowPlus(3600)); err != nil {
		t.Fatal(err)
	}
}

// mustWrite writes a file, creating its directory.
func mustWrite(t testing.TB, p string, b []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// dirNames lists a directory's entries (for "nothing written elsewhere"
// checks).
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func hasPrefixAny(s string, ps ...string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func inodeOf(fi fs.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }
