package builtin

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/sys"
)

const testVersion = "test"

// needRoot skips tests that chown files and mount layers when not root,
// and those that need mkfs.erofs when it is missing.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("built-in layers set file owners and are mounted: needs root")
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skipf("could not find mkfs.erofs (Debian erofs-utils): %v", err)
	}
}

var testSpecs struct {
	once  sync.Once
	specs []Spec
}

// spec returns the built-in spec name of a binary of version testVersion.
func spec(t *testing.T, name string) Spec {
	t.Helper()
	testSpecs.once.Do(func() { testSpecs.specs = Specs(testVersion) })
	for _, s := range testSpecs.specs {
		if s.Name == name {
			if s.err != nil {
				t.Fatalf("%s cannot be built here: %v", name, s.err)
			}
			return s
		}
	}
	t.Fatalf("no built-in spec %q", name)
	return Spec{}
}

// fill fills s's tree into a new directory and returns it.
func fill(t *testing.T, s Spec) string {
	t.Helper()
	dir := t.TempDir()
	if err := s.Fill(context.Background(), dir); err != nil {
		t.Fatalf("filling %s: %v", s.Name, err)
	}
	return dir
}

// entry describes a file of a tree.
type entry struct {
	mode     fs.FileMode
	uid, gid uint32
	link     string // a symlink's target
}

// walk lists every entry under dir by its slash path relative to dir.
func walk(t *testing.T, dir string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(dir, p)
		e := entry{mode: fi.Mode(), uid: st.Uid, gid: st.Gid}
		if fi.Mode()&fs.ModeSymlink != 0 {
			e.link, _ = os.Readlink(p)
		}
		out[filepath.ToSlash(rel)] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mount mounts art read-only on a new directory, unmounted (and checked
// gone) when the test ends.
func mount(t *testing.T, art layer.Artifact) string {
	t.Helper()
	mnt := t.TempDir()
	if err := sys.MountErofs(filepath.Join(art.Dir, layer.MetaFile), filepath.Join(art.Dir, layer.BlobFile), mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sys.Unmount(mnt); err != nil {
			t.Error(err)
		}
		if m, err := sys.MountsUnder(mnt); err != nil || len(m) > 0 {
			t.Errorf("mounts left under %s: %q (%v)", mnt, m, err)
		}
	})
	return mnt
}

// readStamp reads the stamp of the artifact in dir.
func readStamp(t *testing.T, dir string) stamp {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	if err != nil {
		t.Fatal(err)
	}
	var st stamp
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}
