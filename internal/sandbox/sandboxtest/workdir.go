package sandboxtest

import (
	"context"
	"errors"
	"path"
	"slices"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// The working directory (sandbox.Workdir) is one directory for the files
// API and for commands, on every tier: what one is given by a relative
// path, the other finds by the same path. These cases are the most
// common pattern of an agent harness (write a file, run a command on it),
// which once worked on one tier and failed on the three others.

// wantRead fails unless the command argv, run in cwd, prints want.
func wantRead(t *testing.T, sb sandbox.Sandbox, argv []string, cwd, want string) {
	t.Helper()
	res := run(t, sb, api.ExecRequest{Cmd: argv, Cwd: cwd})
	if res.ExitCode != 0 || res.Stdout != want {
		t.Errorf("%q in cwd %q: %+v, want stdout %q", argv, cwd, res, want)
	}
}

func testWorkdirWriteThenRun(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	fi := write(t, sb.Files(), "x/hello.txt", "hi\n", sandbox.WriteOptions{Parents: true})
	if want := path.Join(sandbox.Workdir, "x/hello.txt"); fi.Path != want {
		t.Errorf("Write(x/hello.txt).Path = %q, want %q", fi.Path, want)
	}
	wantRead(t, sb, f.Commands.ReadFile("x/hello.txt"), "", "hi\n")
	// The other way round: a command's relative file is the API's.
	res := run(t, sb, api.ExecRequest{Cmd: f.Commands.WriteFile("from-cmd.txt"), Stdin: "by a command\n"})
	if res.ExitCode != 0 {
		t.Fatalf("command writing from-cmd.txt: %+v", res)
	}
	if got := readAll(t, sb.Files(), "from-cmd.txt"); got != "by a command\n" {
		t.Errorf("API reading the command's from-cmd.txt: %q", got)
	}
}

// testWorkdirAbsolute: a relative path and the same path under
// sandbox.Workdir are one file, for the API and for commands, nested
// directories included.
func testWorkdirAbsolute(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	fs := sb.Files()
	ctx := context.Background()
	write(t, fs, "a/b/c.txt", "nested\n", sandbox.WriteOptions{Parents: true})
	abs := path.Join(sandbox.Workdir, "a/b/c.txt")
	for _, p := range []string{"a/b/c.txt", abs} {
		if got := readAll(t, fs, p); got != "nested\n" {
			t.Errorf("API reading %s: %q", p, got)
		}
		wantRead(t, sb, f.Commands.ReadFile(p), "", "nested\n")
	}
	rel, err := fs.Stat(ctx, "a/b")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := fs.Stat(ctx, path.Join(sandbox.Workdir, "a/b")); err != nil || st.Path != rel.Path || st.Type != api.FileTypeDir {
		t.Errorf("Stat(a/b) = %+v; Stat(%s/a/b) = %+v, %v", rel, sandbox.Workdir, st, err)
	}
	write(t, fs, path.Join(sandbox.Workdir, "abs.txt"), "absolute\n", sandbox.WriteOptions{})
	if got := readAll(t, fs, "abs.txt"); got != "absolute\n" {
		t.Errorf("API reading abs.txt after writing %s/abs.txt: %q", sandbox.Workdir, got)
	}
	wantRead(t, sb, f.Commands.ReadFile("abs.txt"), "", "absolute\n")
}

// testWorkdirCommandCwd: a command's cwd, relative (to sandbox.Workdir)
// or absolute, is where its relative paths lead; a cwd that is missing or
// not a directory is refused before anything runs.
func testWorkdirCommandCwd(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	write(t, sb.Files(), "a/b/c.txt", "in a/b\n", sandbox.WriteOptions{Parents: true})
	for _, cwd := range []string{"a/b", path.Join(sandbox.Workdir, "a/b")} {
		wantRead(t, sb, f.Commands.ReadFile("c.txt"), cwd, "in a/b\n")
	}
	ctx := context.Background()
	_, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Echo("x"), Cwd: "no/such/dir", TimeoutS: 30}})
	if !errors.Is(err, errdefs.NotFound) {
		t.Errorf("cwd no/such/dir: err = %v, want NotFound", err)
	}
	_, err = sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: f.Commands.Echo("x"), Cwd: "a/b/c.txt", TimeoutS: 30}})
	if !errors.Is(err, errdefs.Invalid) {
		t.Errorf("cwd a/b/c.txt, a file: err = %v, want Invalid", err)
	}
}

// testWorkdirList: List(".") is sandbox.Workdir, with what was written
// there by relative paths.
func testWorkdirList(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	fs := sb.Files()
	write(t, fs, "x/hello.txt", "hi\n", sandbox.WriteOptions{Parents: true})
	write(t, fs, "top.txt", "top\n", sandbox.WriteOptions{})
	list, err := fs.List(context.Background(), ".", 2)
	if err != nil {
		t.Fatalf("List(.): %v", err)
	}
	var got []string
	for _, fi := range list {
		got = append(got, fi.Path)
	}
	for _, want := range []string{"x", "x/hello.txt", "top.txt"} {
		if p := path.Join(sandbox.Workdir, want); !slices.Contains(got, p) {
			t.Errorf("List(., 2) = %q, lacks %s", got, p)
		}
	}
}

// testWorkdirPWD: PWD names the command's working directory, as Go's and
// the shells' getwd trust it to (a request's own PWD does not change it).
func testWorkdirPWD(t *testing.T, f Factory) {
	sb := newEnv(t, f).newSandbox()
	if _, err := sb.Files().Mkdir(context.Background(), "sub", false); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ cwd, want string }{
		{"", sandbox.Workdir},
		{"sub", path.Join(sandbox.Workdir, "sub")},
	} {
		res := run(t, sb, api.ExecRequest{Cmd: f.Commands.Env(), Cwd: tt.cwd, Env: map[string]string{"PWD": "/elsewhere"}})
		if !containsLine(res.Stdout, "PWD="+tt.want) {
			t.Errorf("env in cwd %q lacks PWD=%s:\n%s", tt.cwd, tt.want, res.Stdout)
		}
	}
}
