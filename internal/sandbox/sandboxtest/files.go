package sandboxtest

import (
	"context"
	"errors"
	"io"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// work is the absolute path of rel in the working directory, where tests
// may write on every tier.
func work(rel string) string {
	return path.Join(sandbox.Workdir, rel)
}

func readAll(t *testing.T, fs sandbox.Files, p string) string {
	t.Helper()
	rc, _, err := fs.Open(context.Background(), p)
	if err != nil {
		t.Fatalf("Open(%s): %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b)
}

func write(t *testing.T, fs sandbox.Files, p, content string, opt sandbox.WriteOptions) api.FileInfo {
	t.Helper()
	fi, err := fs.Write(context.Background(), p, strings.NewReader(content), opt)
	if err != nil {
		t.Fatalf("Write(%s): %v", p, err)
	}
	return fi
}

func testFilesRoundTrip(t *testing.T, f Factory) {
	e := newEnv(t, f)
	fs := e.newSandbox().Files()
	ctx := context.Background()
	p := work("dir/sub/hello.txt")
	fi := write(t, fs, p, "hello\n", sandbox.WriteOptions{Parents: true, Mode: 0o640})
	if fi.Path != p || fi.Name != "hello.txt" || fi.Type != api.FileTypeFile || fi.Size != 6 || fi.Mode != 0o640 {
		t.Errorf("Write info = %+v", fi)
	}
	if got := readAll(t, fs, p); got != "hello\n" {
		t.Errorf("read back %q", got)
	}
	// Overwrite replaces the content entirely.
	write(t, fs, p, "x", sandbox.WriteOptions{})
	if got := readAll(t, fs, p); got != "x" {
		t.Errorf("after overwrite %q", got)
	}
	st, err := fs.Stat(ctx, path.Dir(p))
	if err != nil || st.Type != api.FileTypeDir {
		t.Errorf("Stat(dir) = %+v, %v", st, err)
	}
	if _, err := fs.Mkdir(ctx, work("a/b/c"), true); err != nil {
		t.Errorf("Mkdir parents: %v", err)
	}
	if _, err := fs.Mkdir(ctx, work("x/y"), false); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Mkdir without parents under a missing dir: err = %v, want NotFound", err)
	}
	if _, err := fs.Mkdir(ctx, work("a"), false); !errors.Is(err, errdefs.Conflict) {
		t.Errorf("Mkdir existing: err = %v, want Conflict", err)
	}
	to := work("a/b/moved.txt")
	if fi, err := fs.Rename(ctx, p, to); err != nil || fi.Path != to {
		t.Fatalf("Rename = %+v, %v", fi, err)
	}
	if _, err := fs.Stat(ctx, p); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("old name after rename: err = %v, want NotFound", err)
	}
	if got := readAll(t, fs, to); got != "x" {
		t.Errorf("renamed content %q", got)
	}
	if err := fs.Remove(ctx, work("a"), false); err == nil {
		t.Errorf("non-recursive Remove of a non-empty dir succeeded")
	}
	if err := fs.Remove(ctx, work("a"), true); err != nil {
		t.Errorf("recursive Remove: %v", err)
	}
	if _, err := fs.Stat(ctx, to); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("after Remove: err = %v, want NotFound", err)
	}
	// Large file: 8 MiB of patterned data.
	big := strings.Repeat("dsec-large-file-", 512<<10)
	write(t, fs, work("big.bin"), big, sandbox.WriteOptions{})
	if got := readAll(t, fs, work("big.bin")); got != big {
		t.Errorf("large file round trip: got %d bytes, want %d", len(got), len(big))
	}
	_, err = fs.Write(ctx, work("capped.bin"), strings.NewReader(strings.Repeat("z", 5000)), sandbox.WriteOptions{MaxBytes: 4096})
	if !errors.Is(err, errdefs.TooLarge) {
		t.Errorf("Write past MaxBytes: err = %v, want TooLarge", err)
	}
	if _, err := fs.Stat(ctx, work("capped.bin")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a refused write left a file behind: %v", err)
	}
}

func testFilesSeenByCommands(t *testing.T, f Factory) {
	e := newEnv(t, f)
	sb := e.newSandbox()
	p := work("from-api.txt")
	write(t, sb.Files(), p, "written by the API\n", sandbox.WriteOptions{})
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.ReadFile(p)})
	if res.ExitCode != 0 || res.Stdout != "written by the API\n" {
		t.Errorf("command reading an API-written file: %+v", res)
	}
	q := work("from-cmd.txt")
	res = run(t, sb, api.ExecRequest{Cmd: f.Commands.WriteFile(q), Stdin: "written by a command\n"})
	if res.ExitCode != 0 {
		t.Fatalf("command writing a file: %+v", res)
	}
	if got := readAll(t, sb.Files(), q); got != "written by a command\n" {
		t.Errorf("API reading a command-written file: %q", got)
	}
	// State persists across calls.
	res = run(t, sb, api.ExecRequest{Cmd: f.Commands.ReadFile(q)})
	if res.Stdout != "written by a command\n" {
		t.Errorf("second call reading the file: %+v", res)
	}
	// What a program creates has the same mode on every tier: umask
	// 022's (WebAssembly has no modes; the function tier gives these).
	if st, err := sb.Files().Stat(context.Background(), q); err != nil || st.Mode != 0o644 {
		t.Errorf("a command's new file: %+v, %v; want mode 0644", st, err)
	}
}

func testFilesListDepth(t *testing.T, f Factory) {
	e := newEnv(t, f)
	fs := e.newSandbox().Files()
	base := work("tree")
	for _, p := range []string{"a.txt", "d1/b.txt", "d1/d2/c.txt"} {
		write(t, fs, path.Join(base, p), p, sandbox.WriteOptions{Parents: true})
	}
	names := func(depth int) []string {
		list, err := fs.List(context.Background(), base, depth)
		if err != nil {
			t.Fatalf("List depth %d: %v", depth, err)
		}
		var out []string
		for _, fi := range list {
			out = append(out, strings.TrimPrefix(fi.Path, base+"/"))
		}
		slices.Sort(out)
		return out
	}
	if got, want := names(1), []string{"a.txt", "d1"}; !slices.Equal(got, want) {
		t.Errorf("depth 1 = %q, want %q", got, want)
	}
	if got, want := names(3), []string{"a.txt", "d1", "d1/b.txt", "d1/d2", "d1/d2/c.txt"}; !slices.Equal(got, want) {
		t.Errorf("depth 3 = %q, want %q", got, want)
	}
	if _, err := fs.List(context.Background(), path.Join(base, "a.txt"), 1); err == nil {
		t.Errorf("List of a file succeeded")
	}
}

func testFilesTraversal(t *testing.T, f Factory) {
	e := newEnv(t, f)
	fs := e.newSandbox().Files()
	ctx := context.Background()
	root := e.rt.Capabilities().FileRoot
	bad := []string{"../../../../etc/passwd", root + "/../../etc/passwd", "a/../../x", "with\x00nul"}
	if root != "/" {
		bad = append(bad, "/etc/passwd", "/tmp/x")
	}
	for _, p := range bad {
		if _, err := fs.Write(ctx, p, strings.NewReader("x"), sandbox.WriteOptions{Parents: true}); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Write(%q): err = %v, want Invalid", p, err)
		}
		if _, _, err := fs.Open(ctx, p); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Open(%q): err = %v, want Invalid", p, err)
		}
		if _, err := fs.Stat(ctx, p); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Stat(%q): err = %v, want Invalid", p, err)
		}
		if err := fs.Remove(ctx, p, true); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Remove(%q): err = %v, want Invalid", p, err)
		}
		if _, err := fs.Rename(ctx, work("nope"), p); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Rename(→%q): err = %v, want Invalid", p, err)
		}
	}
}

func testFilesErrors(t *testing.T, f Factory) {
	e := newEnv(t, f)
	fs := e.newSandbox().Files()
	ctx := context.Background()
	if _, _, err := fs.Open(ctx, work("missing")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Open missing: err = %v, want NotFound", err)
	}
	if _, err := fs.Stat(ctx, work("missing")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Stat missing: err = %v, want NotFound", err)
	}
	if err := fs.Remove(ctx, work("missing"), false); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Remove missing: err = %v, want NotFound", err)
	}
	if _, err := fs.Mkdir(ctx, work("d"), false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fs.Open(ctx, work("d")); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("Open of a directory: err = %v, want Invalid", err)
	}
	if _, err := fs.Write(ctx, work("no/parent/f"), strings.NewReader("x"), sandbox.WriteOptions{}); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Write without parents: err = %v, want NotFound", err)
	}
}

func testIsolation(t *testing.T, f Factory) {
	e := newEnv(t, f)
	a, b := e.newSandbox(), e.newSandbox()
	p := work("secret.txt")
	write(t, a.Files(), p, "a's secret", sandbox.WriteOptions{})
	if _, err := b.Files().Stat(context.Background(), p); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("sandbox b sees a's file: err = %v", err)
	}
	res := run(t, b, api.ExecRequest{Cmd: f.Commands.ReadFile(p)})
	if res.ExitCode == 0 || strings.Contains(res.Stdout, "secret") {
		t.Errorf("a command in b read a's file: %+v", res)
	}
}

// wantCode fails unless err has class and code.
func wantCode(t *testing.T, what string, err error, class errdefs.Class, code string) {
	t.Helper()
	if !errors.Is(err, class) || errdefs.CodeOf(err) != code {
		t.Errorf("%s: err = %v (class %s, code %s), want %s %s", what, err, errdefs.ClassOf(err), errdefs.CodeOf(err), class, code)
	}
}

// testFilesEdgeCases: what the file system refuses reaches the user as a
// 4xx class with its own code, not as an internal error, and reading a
// FIFO is refused at once instead of waiting for a writer.
func testFilesEdgeCases(t *testing.T, f Factory) {
	e := newEnv(t, f)
	sb := e.newSandbox()
	fs := sb.Files()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := work("edge")
	if _, err := fs.Mkdir(ctx, dir, true); err != nil {
		t.Fatal(err)
	}
	long := path.Join(dir, strings.Repeat("n", 256))
	_, err := fs.Write(ctx, long, strings.NewReader("x"), sandbox.WriteOptions{})
	wantCode(t, "Write of a 256-byte name", err, errdefs.Invalid, sandbox.CodeNameTooLong)
	_, err = fs.Mkdir(ctx, long, false)
	wantCode(t, "Mkdir of a 256-byte name", err, errdefs.Invalid, sandbox.CodeNameTooLong)
	_, err = fs.Stat(ctx, long)
	wantCode(t, "Stat of a 256-byte name", err, errdefs.Invalid, sandbox.CodeNameTooLong)
	write(t, fs, path.Join(dir, "f"), "x", sandbox.WriteOptions{})
	_, err = fs.Rename(ctx, path.Join(dir, "f"), long)
	wantCode(t, "Rename to a 256-byte name", err, errdefs.Invalid, sandbox.CodeNameTooLong)
	// 255 bytes is a valid name.
	write(t, fs, path.Join(dir, strings.Repeat("m", 255)), "x", sandbox.WriteOptions{})
	_, err = fs.Stat(ctx, path.Join(dir, "f", "under-a-file"))
	wantCode(t, "Stat under a file", err, errdefs.NotFound, sandbox.CodeParentNotDirectory)
	if _, err := fs.Mkdir(ctx, path.Join(dir, "d"), false); err != nil {
		t.Fatal(err)
	}
	_, err = fs.Rename(ctx, path.Join(dir, "d"), path.Join(dir, "d", "inside"))
	wantCode(t, "Rename of a directory into itself", err, errdefs.Invalid, sandbox.CodeInvalidOperation)
	_, err = fs.Mkdir(ctx, path.Join(dir, "d"), false)
	wantCode(t, "Mkdir of an existing directory", err, errdefs.Conflict, sandbox.CodeFileExists)
	write(t, fs, path.Join(dir, "d", "x"), "x", sandbox.WriteOptions{})
	wantCode(t, "Remove of a non-empty directory", fs.Remove(ctx, path.Join(dir, "d"), false), errdefs.Conflict, sandbox.CodeDirectoryNotEmpty)
	// No temporary file of the refused writes is left.
	list, err := fs.List(ctx, dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, fi := range list {
		if strings.HasPrefix(fi.Name, ".dsec-write-") {
			t.Errorf("a refused write left %s", fi.Path)
		}
	}
	if f.Commands.MkFifo == nil {
		t.Logf("the %s tier's programs cannot make a FIFO; its own tests read one", e.rt.Tier())
		return
	}
	fifo := path.Join(dir, "fifo")
	if res := run(t, sb, api.ExecRequest{Cmd: f.Commands.MkFifo(fifo)}); res.ExitCode != 0 {
		t.Fatalf("mkfifo: %+v", res)
	}
	start := time.Now()
	octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
	defer ocancel()
	rc, _, err := fs.Open(octx, fifo)
	if rc != nil {
		rc.Close()
	}
	wantCode(t, "Open of a FIFO", err, errdefs.Invalid, sandbox.CodeNotAFile)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Open of a FIFO took %v: it waited for a writer", d)
	}
	// A tier that opened the FIFO still waits for a writer: give it one,
	// so that the sandbox can stop. (A correct tier has no reader, and
	// the writer waits out its 2 s.)
	_, _ = sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.WriteFile(fifo), TimeoutS: 2}})
	st, err := fs.Stat(ctx, fifo)
	if err != nil || st.Type != api.FileTypeOther {
		t.Errorf("Stat of a FIFO = %+v, %v; want type other", st, err)
	}
}
