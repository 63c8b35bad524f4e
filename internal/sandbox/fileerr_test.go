//go:build linux

package sandbox

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestFileErrnosAll: every listed errno, as os and os.Root report it
// (in a *PathError or, for a rename, a *LinkError), gets its class and
// code, and its message names the path.
func TestFileErrnosAll(t *testing.T) {
	for _, e := range FileErrnos {
		for _, err := range []error{
			&fs.PathError{Op: "openat", Path: "x", Err: e.Errno},
			&os.LinkError{Op: "renameat", Old: "a", New: "b", Err: e.Errno},
		} {
			got := FileError("/workspace/f", err)
			if errdefs.ClassOf(got) != e.Class || errdefs.CodeOf(got) != e.Code {
				t.Errorf("%v (%T): class %s code %s, want %s %s", e.Errno, err, errdefs.ClassOf(got), errdefs.CodeOf(got), e.Class, e.Code)
			}
			if !strings.Contains(errdefs.MessageOf(got), "/workspace/f") {
				t.Errorf("%v: message %q does not name the path", e.Errno, errdefs.MessageOf(got))
			}
		}
		if !registered(e.Code, e.Class) {
			t.Errorf("%v: code %s is not in api.ErrorCodes with class %s", e.Errno, e.Code, e.Class)
		}
	}
	// An errno not listed is Internal with a stable code; the message
	// keeps the errno's text, which names nothing of the host.
	got := FileError("/f", &fs.PathError{Op: "x", Path: "f", Err: syscall.ENOLINK})
	if errdefs.ClassOf(got) != errdefs.Internal || errdefs.CodeOf(got) != CodeFileIOError || !strings.Contains(errdefs.MessageOf(got), "link has been severed") {
		t.Errorf("unlisted errno: %s %s %q", errdefs.ClassOf(got), errdefs.CodeOf(got), errdefs.MessageOf(got))
	}
}

// TestFileErrorRealCalls: the errors real calls on an os.Root return
// reach their class; before the shared map a rename's ENAMETOOLONG (a
// *LinkError) was an unclassified 500 and a stat's was reported as a
// path leading out of the root.
func TestFileErrorRealCalls(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	long := strings.Repeat("n", 256)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(root.WriteFile("file", []byte("x"), 0o644))
	must(root.Mkdir("dir", 0o755))
	must(root.WriteFile("dir/in", []byte("x"), 0o644))
	must(root.Symlink("loop", "loop"))
	must(root.Symlink("../..", "out"))
	tests := []struct {
		name  string
		err   error
		class errdefs.Class
		code  string
	}{
		{"rename to a long name", root.Rename("file", long), errdefs.Invalid, CodeNameTooLong},
		{"stat of a long name", func() error { _, err := root.Stat(long); return err }(), errdefs.Invalid, CodeNameTooLong},
		{"mkdir of a long name", root.Mkdir(long, 0o755), errdefs.Invalid, CodeNameTooLong},
		{"missing", func() error { _, err := root.Stat("nope"); return err }(), errdefs.NotFound, CodeFileNotFound},
		{"through a file", func() error { _, err := root.Stat("file/x"); return err }(), errdefs.NotFound, CodeParentNotDirectory},
		{"symlink loop", func() error { _, err := root.Open("loop/x"); return err }(), errdefs.Invalid, CodeSymlinkLoop},
		{"escape", func() error { _, err := root.Open("out/etc"); return err }(), errdefs.Invalid, CodePathOutsideRoot},
		{"mkdir existing", root.Mkdir("dir", 0o755), errdefs.Conflict, CodeFileExists},
		{"rmdir not empty", root.Remove("dir"), errdefs.Conflict, CodeDirectoryNotEmpty},
		{"dir into itself", root.Rename("dir", "dir/sub"), errdefs.Invalid, CodeInvalidOperation},
		{"write a dir", func() error { _, err := root.OpenFile("dir", os.O_WRONLY, 0); return err }(), errdefs.Invalid, CodeIsADirectory},
	}
	for _, tt := range tests {
		got := FileError("/p", tt.err)
		if errdefs.ClassOf(got) != tt.class || errdefs.CodeOf(got) != tt.code {
			t.Errorf("%s: %v → %s %s, want %s %s", tt.name, tt.err, errdefs.ClassOf(got), errdefs.CodeOf(got), tt.class, tt.code)
		}
	}
	// A classified error passes unchanged.
	in := errdefs.New(errdefs.NotFound, "sandbox_not_found", "gone")
	if got := FileError("/p", in); got != error(in) {
		t.Errorf("classified error changed: %v", got)
	}
}

// TestOpenRegularRefusesSpecialFiles: a FIFO, a socket and a device are
// refused at once, without opening them (a FIFO's open would wait for a
// writer forever), and so is a directory; a regular file opens.
func TestOpenRegularRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	must(err)
	defer l.Close()
	must(os.Symlink("fifo", filepath.Join(dir, "to-fifo")))
	must(os.Mkdir(filepath.Join(dir, "d"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "f"), []byte("content"), 0o644))
	root, err := os.OpenRoot(dir)
	must(err)
	defer root.Close()
	devRoot, err := os.OpenRoot("/dev")
	must(err)
	defer devRoot.Close()
	for _, tt := range []struct {
		root      *os.Root
		rel, code string
	}{
		{root, "fifo", CodeNotAFile},
		{root, "to-fifo", CodeNotAFile},
		{root, "sock", CodeNotAFile},
		{root, "d", CodeIsADirectory},
		{devRoot, "null", CodeNotAFile},
		{devRoot, "zero", CodeNotAFile},
	} {
		done := make(chan error, 1)
		go func() {
			fh, _, err := OpenRegular(tt.root, "/"+tt.rel, tt.rel)
			if fh != nil {
				fh.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != tt.code {
				t.Errorf("OpenRegular(%s): %v (code %s), want Invalid %s", tt.rel, err, errdefs.CodeOf(err), tt.code)
			}
		case <-time.After(5 * time.Second):
			// Unblock the open so that the test ends.
			if w, err := os.OpenFile(filepath.Join(dir, tt.rel), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			// bounded: the open has its writer now
			<-done
			t.Errorf("OpenRegular(%s) did not return within 5s (it waited for a writer)", tt.rel)
		}
	}
	fh, fi, err := OpenRegular(root, "/f", "f")
	if err != nil || fi.Size() != 7 {
		t.Fatalf("OpenRegular(regular) = %v, %v", fi, err)
	}
	fh.Close()
}

// registered reports whether api.ErrorCodes lists code with class c.
func registered(code string, c errdefs.Class) bool {
	return slices.ContainsFunc(api.ErrorCodes, func(r api.ErrorCode) bool { return r.Code == code && r.Class == string(c) })
}

// TestCleanPathLongName: a name past NAME_MAX is refused before any
// call (and before an upload's body is read), with its own code.
func TestCleanPathLongName(t *testing.T) {
	ok := "/workspace/" + strings.Repeat("a", MaxNameLen)
	if _, err := CleanPath("/workspace", ok); err != nil {
		t.Errorf("a %d-byte name: %v", MaxNameLen, err)
	}
	for _, p := range []string{ok + "b", "/workspace/" + strings.Repeat("a", 300) + "/x", strings.Repeat("r", 256)} {
		_, err := CleanPath("/workspace", p)
		if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != CodeNameTooLong {
			t.Errorf("CleanPath(%.20s…): %v, want Invalid %s", p, err, CodeNameTooLong)
		}
	}
}
