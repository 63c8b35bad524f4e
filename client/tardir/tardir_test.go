package tardir

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/internal/sys"
)

// entry is what a test checks of one tar entry.
type entry struct {
	Name     string
	Type     byte
	Mode     int64
	Uid, Gid int
	Size     int64
	Link     string
	Data     string
	Xattrs   map[string]string
}

// makeTree fills dir with a tree that has every kind of entry Write
// handles. reverse creates the entries in the opposite order, so that
// inode numbers and directory order on disk differ between two copies.
// It reports whether the file system took the xattrs.
func makeTree(t *testing.T, dir string, reverse bool) (xattrs bool) {
	t.Helper()
	steps := []func() error{
		func() error { return os.MkdirAll(filepath.Join(dir, "src/pkg"), 0o755) },
		func() error { return os.MkdirAll(filepath.Join(dir, "tmp"), 0o755) },
		func() error {
			return os.WriteFile(filepath.Join(dir, "src/pkg/main.py"), []byte("print('hi')\n"), 0o644)
		},
		func() error {
			return os.WriteFile(filepath.Join(dir, "src/run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755)
		},
		func() error { return os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600) },
		func() error {
			return os.WriteFile(filepath.Join(dir, "a.txt"), bytes.Repeat([]byte("a"), 70000), 0o640)
		},
		func() error { return os.Symlink("src/run.sh", filepath.Join(dir, "link")) },
		func() error { return os.Symlink("/nowhere", filepath.Join(dir, "src/dangling")) },
	}
	if reverse {
		for i, j := 0, len(steps)-1; i < j; i, j = i+1, j-1 {
			steps[i], steps[j] = steps[j], steps[i]
		}
		// Directories first, still.
		steps = append(steps[len(steps)-2:], steps[:len(steps)-2]...)
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Fatal(err)
		}
	}
	// Hard links: a.txt has two more names; made in either order, the
	// first in lexical order ("a.txt") is the file.
	links := []string{"src/pkg/a-link", "hard"}
	if reverse {
		links[0], links[1] = links[1], links[0]
	}
	for _, l := range links {
		if err := os.Link(filepath.Join(dir, "a.txt"), filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	// chmod, after creation, so that the umask does not interfere.
	for p, m := range map[string]os.FileMode{
		"src/run.sh": 0o755 | os.ModeSetuid,
		"src/pkg":    0o755 | os.ModeSetgid,
		"tmp":        0o777 | os.ModeSticky,
		"empty":      0o600,
		"a.txt":      0o640,
	} {
		if err := os.Chmod(filepath.Join(dir, p), m); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(dir, "src/pkg/main.py"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	if err := sys.SetXattr(filepath.Join(dir, "src/pkg/main.py"), "user.dsec.test", []byte("v\x00\xff")); err != nil {
		return false
	}
	if err := sys.SetXattr(filepath.Join(dir, "src"), "user.b", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := sys.SetXattr(filepath.Join(dir, "src"), "user.a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	return true
}

func tarOf(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(dir, &buf); err != nil {
		t.Fatalf("Write(%s): %v", dir, err)
	}
	return buf.Bytes()
}

func readEntries(t *testing.T, b []byte) []entry {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []entry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) || !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s: times %v %v %v, want mtime 0 and no atime or ctime", h.Name, h.ModTime, h.AccessTime, h.ChangeTime)
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: user %q group %q, want numeric owners only", h.Name, h.Uname, h.Gname)
		}
		e := entry{Name: h.Name, Type: h.Typeflag, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, Size: h.Size, Link: h.Linkname}
		if len(data) > 64 {
			e.Data = "len:" + strconv.Itoa(len(data))
		} else {
			e.Data = string(data)
		}
		for k, v := range h.PAXRecords {
			if name, ok := strings.CutPrefix(k, xattrPrefix); ok {
				if e.Xattrs == nil {
					e.Xattrs = map[string]string{}
				}
				e.Xattrs[name] = v
			}
		}
		out = append(out, e)
	}
}

func TestWriteDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	xa := makeTree(t, a, false)
	xb := makeTree(t, b, true)
	if xa != xb {
		t.Fatal("xattr support differs between two temporary directories")
	}
	ta, tb := tarOf(t, a), tarOf(t, b)
	if sa, sb := sha256.Sum256(ta), sha256.Sum256(tb); sa != sb {
		t.Errorf("two copies of a tree gave different tars:\n%+v\n%+v", readEntries(t, ta), readEntries(t, tb))
	}
	if again := tarOf(t, a); !bytes.Equal(again, ta) {
		t.Error("the same directory gave different tars")
	}
	// Touching files changes nothing.
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(a, "src/run.sh"), old, old); err != nil {
		t.Fatal(err)
	}
	if again := tarOf(t, a); !bytes.Equal(again, ta) {
		t.Error("a new mtime changed the tar")
	}
}

func TestWriteContent(t *testing.T) {
	dir := t.TempDir()
	xattrs := makeTree(t, dir, false)
	// Files made by this test belong to whoever runs it.
	uid, gid := os.Geteuid(), os.Getegid()
	var srcX, mainX map[string]string
	if xattrs {
		srcX = map[string]string{"user.a": "1", "user.b": "2"}
		mainX = map[string]string{"user.dsec.test": "v\x00\xff"}
	} else {
		t.Log("the file system has no user xattrs: not checking them")
	}
	mainUID, mainGID := uid, gid
	if os.Geteuid() == 0 {
		mainUID, mainGID = 1234, 5678
	}
	want := []entry{
		{Name: "a.txt", Type: tar.TypeReg, Mode: 0o640, Uid: uid, Gid: gid, Size: 70000, Data: "len:70000"},
		{Name: "empty", Type: tar.TypeReg, Mode: 0o600, Uid: uid, Gid: gid},
		{Name: "hard", Type: tar.TypeLink, Mode: 0o640, Uid: uid, Gid: gid, Link: "a.txt"},
		{Name: "link", Type: tar.TypeSymlink, Mode: 0o777, Uid: uid, Gid: gid, Link: "src/run.sh"},
		{Name: "src/", Type: tar.TypeDir, Mode: 0o755, Uid: uid, Gid: gid, Xattrs: srcX},
		{Name: "src/dangling", Type: tar.TypeSymlink, Mode: 0o777, Uid: uid, Gid: gid, Link: "/nowhere"},
		{Name: "src/pkg/", Type: tar.TypeDir, Mode: 0o2755, Uid: uid, Gid: gid},
		{Name: "src/pkg/a-link", Type: tar.TypeLink, Mode: 0o640, Uid: uid, Gid: gid, Link: "a.txt"},
		{Name: "src/pkg/main.py", Type: tar.TypeReg, Mode: 0o644, Uid: mainUID, Gid: mainGID, Size: 12, Data: "print('hi')\n", Xattrs: mainX},
		{Name: "src/run.sh", Type: tar.TypeReg, Mode: 0o4755, Uid: uid, Gid: gid, Size: 19, Data: "#!/bin/sh\necho run\n"},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777, Uid: uid, Gid: gid},
	}
	if diff := cmp.Diff(want, readEntries(t, tarOf(t, dir))); diff != "" {
		t.Errorf("entries mismatch (-want +got):\n%s", diff)
	}
}

func TestWriteRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ok"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sys.Mknod(filepath.Join(dir, "pipe"), sys.ModeFifo|0o644, 0, 0); err != nil {
		t.Skipf("cannot make a FIFO: %v", err)
	}
	err := Write(dir, io.Discard)
	if !errors.Is(err, ErrUnsupportedFile) || !strings.Contains(err.Error(), "pipe (FIFO)") {
		t.Errorf("Write of a tree with a FIFO: %v, want ErrUnsupportedFile naming it", err)
	}
}

func TestWriteRootSymlinkAndErrors(t *testing.T) {
	dir := t.TempDir()
	makeTree(t, dir, false)
	link := filepath.Join(t.TempDir(), "tree")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tarOf(t, link), tarOf(t, dir)) {
		t.Error("a symlink to a tree gave another tar than the tree")
	}
	if err := Write(filepath.Join(dir, "a.txt"), io.Discard); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Write of a file: %v", err)
	}
	if err := Write(filepath.Join(dir, "missing"), io.Discard); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Write of a missing directory: %v", err)
	}
	// An empty directory is an empty archive.
	entries := readEntries(t, tarOf(t, t.TempDir()))
	if len(entries) != 0 {
		t.Errorf("empty directory gave %+v", entries)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	makeTree(t, dir, false)
	rc := Open(dir)
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, tarOf(t, dir)) {
		t.Error("Open's stream differs from Write's")
	}

	// Closing early stops the writer (the 70000-byte file does not fit in
	// one read) and Close waits for it.
	rc = Open(dir)
	if _, err := rc.Read(make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}

	// Write's error reaches the reader.
	rc = Open(filepath.Join(dir, "missing"))
	defer rc.Close()
	if _, err := io.ReadAll(rc); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reading the tar of a missing directory: %v", err)
	}
}
