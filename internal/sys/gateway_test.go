package sys

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// gatewayOS are the systems whose files the gateway rule covers: those
// DSec runs on and those it builds for (see the package doc).
var gatewayOS = []struct{ goos, goarch string }{
	{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"},
}

// TestGateway keeps this package the one way into the kernel: no Go file
// of the module outside it (tests, testdata and files for other systems
// aside; see the package doc) calls a function of package syscall or
// imports golang.org/x/sys/unix.
func TestGateway(t *testing.T) {
	root := moduleRoot(t)
	funcs := syscallFuncs(t)
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); rel != "." && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules" || n == "vendor") || rel == filepath.Join("internal", "sys") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || !buildsForGatewayOS(t, p) {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		problems, err := checkGateway(fset, rel, src, funcs)
		if err != nil {
			return err
		}
		for _, pr := range problems {
			t.Error(pr)
		}
		checked++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Errorf("checked %d files: the walk is broken", checked)
	}
}

// TestCheckGateway shows that the rule catches what it is for, and only
// that.
func TestCheckGateway(t *testing.T) {
	src := `package p

import (
	"syscall"
	sc "syscall"

	"golang.org/x/sys/unix"
)

func f(pid int) error {
	var ws syscall.WaitStatus
	_ = ws.Exited()
	_ = syscall.Signal(9)
	_ = syscall.SIGTERM
	_ = unix.EPERM
	g := sc.Getpid
	_ = g
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	syscall := struct{ Kill func(int, int) error }{}
	return syscall.Kill(pid, 9)
}
`
	got, err := checkGateway(token.NewFileSet(), "p/p.go", []byte(src), syscallFuncs(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"p/p.go:7: imports golang.org/x/sys/unix: use internal/sys",
		"p/p.go:16: uses syscall.Getpid: call it through internal/sys",
		"p/p.go:18: uses syscall.Wait4: call it through internal/sys",
	}
	if !slices.Equal(got, want) {
		t.Errorf("checkGateway found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got, err = checkGateway(token.NewFileSet(), "q.go", []byte("package q\n\nimport . \"syscall\"\n\nvar _ = Getpid\n"), syscallFuncs(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"q.go:3: dot-imports syscall: name its functions, through internal/sys"}; !slices.Equal(got, want) {
		t.Errorf("checkGateway found %q, want %q", got, want)
	}
}

// checkGateway returns the gateway rule's complaints about one file
// (named name in them), as "name:line: …". A use of package syscall is
// one of its package-level functions, called or not; its types,
// constants, variables and the methods of its types are allowed.
func checkGateway(fset *token.FileSet, name string, src []byte, funcs map[string]bool) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		return nil, err
	}
	var out []string
	complain := func(pos token.Pos, format string, args ...any) {
		out = append(out, fmt.Sprintf("%s:%d: ", name, fset.Position(pos).Line)+fmt.Sprintf(format, args...))
	}
	names := map[string]bool{} // what package syscall is called in this file
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		switch {
		case path == "golang.org/x/sys/unix":
			complain(imp.Pos(), "imports golang.org/x/sys/unix: use internal/sys")
		case path == "syscall" && imp.Name == nil:
			names["syscall"] = true
		case path == "syscall" && imp.Name.Name == ".":
			complain(imp.Pos(), "dot-imports syscall: name its functions, through internal/sys")
		case path == "syscall" && imp.Name.Name != "_":
			names[imp.Name.Name] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		// A package name is never resolved to a declaration (Obj nil);
		// a local variable of the same name is.
		if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil && names[id.Name] && funcs[sel.Sel.Name] {
			complain(sel.Pos(), "uses syscall.%s: call it through internal/sys", sel.Sel.Name)
		}
		return true
	})
	return out, nil
}

// syscallFuncs returns the names of package syscall's exported
// package-level functions on every system of gatewayOS, read from its
// source in the Go toolchain.
func syscallFuncs(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "src", "syscall")
	funcs := map[string]bool{}
	fset := token.NewFileSet()
	parsed := map[string]bool{}
	for _, s := range gatewayOS {
		ctx := build.Default
		ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = s.goos, s.goarch, false
		pkg, err := ctx.ImportDir(dir, 0)
		if err != nil {
			t.Fatalf("reading package syscall for %s/%s: %v", s.goos, s.goarch, err)
		}
		for _, name := range pkg.GoFiles {
			if parsed[name] {
				continue
			}
			parsed[name] = true
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.IsExported() {
					funcs[fd.Name.Name] = true
				}
			}
		}
	}
	for _, name := range []string{"Mount", "Kill", "Wait4", "RawSyscall", "Getpid"} {
		if !funcs[name] {
			t.Fatalf("package syscall's functions, as read, lack %s", name)
		}
	}
	return funcs
}

// buildsForGatewayOS reports whether the file at path is built for any
// system of gatewayOS (by its name and build constraints).
func buildsForGatewayOS(t *testing.T, path string) bool {
	t.Helper()
	for _, s := range gatewayOS {
		ctx := build.Default
		ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = s.goos, s.goarch, false
		ok, err := ctx.MatchFile(filepath.Dir(path), filepath.Base(path))
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return true
		}
	}
	return false
}
