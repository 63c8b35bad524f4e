package function

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/google/go-cmp/cmp"
)

func TestFilesErrorCodes(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	fs := create(t, rt, nil).Files()
	ctx := context.Background()
	write := func(p string) {
		t.Helper()
		if _, err := fs.Write(ctx, p, strings.NewReader("x"), sandbox.WriteOptions{Parents: true}); err != nil {
			t.Fatal(err)
		}
	}
	write("/workspace/d/f")
	tests := []struct {
		name  string
		op    func() error
		class errdefs.Class
		code  string
	}{
		{"open missing", func() error { _, _, err := fs.Open(ctx, "nope"); return err }, errdefs.NotFound, "file_not_found"},
		{"open dir", func() error { _, _, err := fs.Open(ctx, "d"); return err }, errdefs.Invalid, "is_a_directory"},
		{"write over dir", func() error {
			_, err := fs.Write(ctx, "d", strings.NewReader("x"), sandbox.WriteOptions{})
			return err
		}, errdefs.Invalid, "is_a_directory"},
		{"write root", func() error {
			_, err := fs.Write(ctx, "/workspace", strings.NewReader("x"), sandbox.WriteOptions{})
			return err
		}, errdefs.Invalid, "is_a_directory"},
		{"write without parent", func() error {
			_, err := fs.Write(ctx, "x/y", strings.NewReader("x"), sandbox.WriteOptions{})
			return err
		}, errdefs.NotFound, "parent_not_found"},
		{"write past MaxBytes", func() error {
			_, err := fs.Write(ctx, "big", strings.NewReader("12345"), sandbox.WriteOptions{MaxBytes: 4})
			return err
		}, errdefs.TooLarge, "file_too_large"},
		{"mkdir existing", func() error { _, err := fs.Mkdir(ctx, "d", false); return err }, errdefs.Conflict, "file_exists"},
		{"mkdir without parent", func() error { _, err := fs.Mkdir(ctx, "a/b", false); return err }, errdefs.NotFound, "file_not_found"},
		{"remove non-empty", func() error { return fs.Remove(ctx, "d", false) }, errdefs.Conflict, "directory_not_empty"},
		{"remove missing", func() error { return fs.Remove(ctx, "nope", true) }, errdefs.NotFound, "file_not_found"},
		{"remove root", func() error { return fs.Remove(ctx, "/workspace", true) }, errdefs.Invalid, "path_is_root"},
		{"rename missing", func() error { _, err := fs.Rename(ctx, "nope", "x"); return err }, errdefs.NotFound, "file_not_found"},
		{"list a file", func() error { _, err := fs.List(ctx, "d/f", 1); return err }, errdefs.Invalid, "not_a_directory"},
		{"outside", func() error { _, err := fs.Stat(ctx, "/etc"); return err }, errdefs.Invalid, "path_outside_root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			if errdefs.ClassOf(err) != tt.class || errdefs.CodeOf(err) != tt.code {
				t.Errorf("err = %v (%s, %s), want %s, %s", err, errdefs.ClassOf(err), errdefs.CodeOf(err), tt.class, tt.code)
			}
		})
	}
	list, err := fs.List(ctx, "/workspace", 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, fi := range list {
		got = append(got, fi.Path)
	}
	if diff := cmp.Diff([]string{"/workspace/d", "/workspace/d/f"}, got); diff != "" {
		t.Errorf("List left temporary files or is unsorted (-want +got):\n%s", diff)
	}
}

func TestFilesListDepthCap(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	fs := create(t, rt, nil).Files()
	ctx := context.Background()
	p := "/workspace"
	for i := 0; i < sandbox.MaxListDepth+3; i++ {
		p += fmt.Sprintf("/%d", i)
	}
	if _, err := fs.Mkdir(ctx, p, true); err != nil {
		t.Fatal(err)
	}
	list, err := fs.List(ctx, "/workspace", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != sandbox.MaxListDepth {
		t.Errorf("List(depth 1000) returned %d entries, want %d", len(list), sandbox.MaxListDepth)
	}
	if list[0].Type != api.FileTypeDir || list[0].Path != "/workspace/0" || list[0].Name != "0" {
		t.Errorf("first entry %+v", list[0])
	}
}

// TestFilesSpecialFiles: a FIFO or a socket in the workspace (the host
// can put one there; the guest cannot) is refused at once, not opened:
// opening a FIFO would wait for a writer until the client gave up.
func TestFilesSpecialFiles(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	fs := sb.Files()
	fifo := filepath.Join(sb.workDir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(sb.workDir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, p := range []string{"fifo", "sock"} {
		done := make(chan error, 1)
		go func() {
			rc, _, err := fs.Open(context.Background(), p)
			if rc != nil {
				rc.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != sandbox.CodeNotAFile {
				t.Errorf("Open(%s): %v (%s), want Invalid not_a_file", p, err, errdefs.CodeOf(err))
			}
		case <-time.After(10 * time.Second):
			// Give the open its writer, so that the test ends.
			if w, err := os.OpenFile(fifo, os.O_RDWR, 0); err == nil {
				w.Close()
			}
			testenv.Recv(t, done, time.Minute, "the open to return once given a writer")
			t.Errorf("Open(%s) waited 10s (for a writer)", p)
		}
	}
}

// TestFilesDownloadBounded: a download ends at the file's size when it
// was opened, and when its request ends.
func TestFilesDownloadBounded(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	fs := sb.Files()
	first := bytes.Repeat([]byte("a"), 64<<10)
	if err := os.WriteFile(filepath.Join(sb.workDir, "growing"), first, 0o644); err != nil {
		t.Fatal(err)
	}
	rc, fi, err := fs.Open(context.Background(), "growing")
	if err != nil || fi.Size != int64(len(first)) {
		t.Fatalf("Open = %+v, %v", fi, err)
	}
	f, err := os.OpenFile(filepath.Join(sb.workDir, "growing"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(bytes.Repeat([]byte("b"), 1<<20))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, first) {
		t.Errorf("download = %d bytes (%d past the size at open), %v", len(got), len(got)-len(first), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rc, _, err = fs.Open(ctx, "growing")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	cancel()
	if n, err := io.Copy(io.Discard, rc); err == nil {
		t.Errorf("a download whose request ended read %d bytes and no error", n)
	}
}

// TestFilesListCap: a listing stops at sandbox.MaxListEntries entries,
// as on the agent tiers, instead of building a reply of any size.
func TestFilesListCap(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, func(s *sandbox.Spec) { s.DiskMB = 256 })
	dir := filepath.Join(sb.workDir, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range sandbox.MaxListEntries + 1 {
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	_, err := sb.Files().List(context.Background(), "many", 1)
	if !errors.Is(err, errdefs.TooLarge) || errdefs.CodeOf(err) != sandbox.CodeTooManyEntries {
		t.Errorf("List of %d entries: %v, want TooLarge too_many_entries", sandbox.MaxListEntries+1, err)
	}
}
