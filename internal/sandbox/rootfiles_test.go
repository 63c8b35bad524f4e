package sandbox

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestRootFiles: the files API's operations over an os.Root, as the
// agent and the function tier both serve them.
func TestRootFiles(t *testing.T) {
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	f := RootFiles{Root: root, Name: "/workspace"}
	ctx := context.Background()
	code := func(err error) string {
		t.Helper()
		if err == nil {
			return ""
		}
		return errdefs.CodeOf(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	abs, rel, err := f.Resolve("a/b.txt")
	if err != nil || abs != "/workspace/a/b.txt" || rel != "a/b.txt" {
		t.Fatalf("Resolve: %q %q %v", abs, rel, err)
	}
	if _, err := f.Write(abs, rel, strings.NewReader("x"), WriteOptions{}); code(err) != CodeParentNotFound {
		t.Errorf("write without its directory: %v", err)
	}
	fi, err := f.Write(abs, rel, strings.NewReader("hello"), WriteOptions{Parents: true, Mode: 0o600})
	if err != nil || fi.Size != 5 || fi.Mode != 0o600 || fi.Path != abs {
		t.Fatalf("Write: %+v %v", fi, err)
	}
	if _, err := f.Write(abs, rel, strings.NewReader("too long"), WriteOptions{MaxBytes: 4}); code(err) != CodeFileTooLarge {
		t.Errorf("write past MaxBytes: %v", err)
	}
	if b, _ := root.ReadFile(rel); string(b) != "hello" {
		t.Errorf("a failed write changed the file: %q", b)
	}
	if _, err := f.Write("/workspace/a", "a", strings.NewReader("x"), WriteOptions{}); code(err) != CodeIsADirectory {
		t.Errorf("write over a directory: %v", err)
	}
	failing := errors.New("the upload broke")
	if _, err := f.Write(abs, rel, iotest.ErrReader(failing), WriteOptions{}); !errors.Is(err, failing) || code(err) != CodeFileIOError {
		t.Errorf("a reader's error: %v", err)
	}
	if ents, _ := root.Open("a"); ents != nil {
		names, _ := ents.Readdirnames(-1)
		ents.Close()
		if len(names) != 1 {
			t.Errorf("temporary files left: %q", names)
		}
	}

	_, err = f.Mkdir("/workspace/a/c/d", "a/c/d", false)
	if code(err) != CodeFileNotFound {
		t.Errorf("mkdir without parents: %v", err)
	}
	if _, err := f.Mkdir("/workspace/a/c/d", "a/c/d", true); err != nil {
		t.Fatal(err)
	}
	list, err := f.List(ctx, "/workspace", ".", 100)
	must(err)
	var paths []string
	for _, e := range list {
		paths = append(paths, e.Path)
	}
	if want := "/workspace/a /workspace/a/b.txt /workspace/a/c /workspace/a/c/d"; strings.Join(paths, " ") != want {
		t.Errorf("List = %q, want %q", paths, want)
	}
	if list, err := f.List(ctx, "/workspace", ".", 0); err != nil || len(list) != 1 || list[0].Type != api.FileTypeDir {
		t.Errorf("List depth 0 (1): %+v %v", list, err)
	}
	if _, err := f.List(ctx, abs, rel, 1); code(err) != CodeNotADirectory {
		t.Errorf("listing a file: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.List(canceled, "/workspace", ".", 1); code(err) != CodeCanceled {
		t.Errorf("a cancelled listing: %v", err)
	}

	if err := f.Remove("/workspace/a/c", "a/c", false); code(err) != CodeDirectoryNotEmpty {
		t.Errorf("removing a directory that is not empty: %v", err)
	}
	if err := f.Remove("/workspace/nope", "nope", false); code(err) != CodeFileNotFound {
		t.Errorf("removing a missing file: %v", err)
	}
	must(f.Remove("/workspace/a/c", "a/c", true))
	if fi, err := f.Rename(abs, rel, "/workspace/b.txt", "b.txt"); err != nil || fi.Path != "/workspace/b.txt" || fi.Size != 5 {
		t.Errorf("Rename: %+v %v", fi, err)
	}
	if _, err := f.Rename(abs, rel, "/workspace/c.txt", "c.txt"); code(err) != CodeFileNotFound {
		t.Errorf("renaming a missing file: %v", err)
	}
	if _, err := f.Stat("/workspace/a", "a"); err != nil {
		t.Errorf("Stat: %v", err)
	}
}
