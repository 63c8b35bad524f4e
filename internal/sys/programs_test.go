package sys

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// programs is every host program DSec's code and tests run by name, and
// where each comes from on a fresh machine of the kind DSec is built on
// (Debian, Go in /usr/local/go, root):
//
//	deb:P     Debian package P, installed by scripts/deps.sh (its runtime
//	          or test list: `make up` and `make test` run it)
//	base:P    Debian package P, part of every system of this kind
//	          (Essential, or Priority required: dpkg and apt)
//	go        the Go toolchain the README requires
//	optional: what the code does without it
//
// TestProgramsInstalled keeps it true: a program run by name that is not
// listed here fails it, and so does a listed one that the README's
// commands do not install.
var programs = map[string]string{
	"apt-cache":          "base:apt",
	"apt-get":            "base:apt",
	"busybox":            "deb:busybox-static",
	"chroot":             "base:coreutils",
	"crun":               "deb:crun",
	"debootstrap":        "deb:debootstrap",
	"dpkg-deb":           "base:dpkg",
	"dpkg-query":         "base:dpkg",
	"fsck.erofs":         "deb:erofs-utils",
	"go":                 "go",
	"ip":                 "deb:iproute2",
	"mkfs.erofs":         "deb:erofs-utils",
	"mkfs.ext4":          "deb:e2fsprogs",
	"mount":              "base:mount",
	"nsenter":            "base:util-linux",
	"qemu-system-x86_64": "deb:qemu-system-x86",
	"runc":               "deb:runc",
	"sleep":              "base:coreutils",
	"sh":                 "base:dash",
	"sync":               "base:coreutils",
	"true":               "base:coreutils",
	"unshare":            "base:util-linux",
	"wat2wasm":           "deb:wabt",
}

// absolutePrograms are run by absolute path: each must be where the code
// looks for it.
var absolutePrograms = map[string]string{
	"/bin/sh":          "base:dash",
	"/bin/true":        "base:coreutils",
	"/bin/sleep":       "base:coreutils",
	"/usr/bin/python3": "deb:python3-minimal",
	"/bin/busybox":     "deb:busybox-static",
}

// TestProgramsInstalled checks that every program the code and tests run
// is in programs (found in the Go sources: the names given to
// exec.Command, exec.CommandContext and exec.LookPath, as literals,
// constants, or through a helper that passes its parameter on), and that
// each one of a package the README's commands install is there after
// they ran: on PATH, from that package, and the package in
// scripts/deps.sh.
func TestProgramsInstalled(t *testing.T) {
	root := moduleRoot(t)
	found := programsInSources(t, root)
	for name, where := range found {
		if _, ok := programs[name]; ok {
			continue
		}
		if _, ok := absolutePrograms[name]; ok {
			continue
		}
		t.Errorf("%s runs %q, which is not in programs: add it with the package that provides it, or as optional", where, name)
	}
	for _, name := range []string{"sh", "wat2wasm", "mkfs.erofs", "qemu-system-x86_64"} {
		if _, ok := found[name]; !ok && programs[name] != "" {
			t.Errorf("the source scan did not find %q, which the code runs: the scan is broken", name)
		}
	}
	lists := depsLists(t, filepath.Join(root, "scripts", "deps.sh"))
	installed := os.Geteuid() == 0 // `make test` ran scripts/deps.sh test as root
	paths := map[string]string{}   // program path → the package it must come from
	check := func(name, where string) {
		kind, pkg, _ := strings.Cut(where, ":")
		switch kind {
		case "deb":
			if !slices.Contains(lists["runtime"], pkg) && !slices.Contains(lists["test"], pkg) {
				t.Errorf("%s comes from package %s, which scripts/deps.sh runtime and test do not install", name, pkg)
			}
		case "base":
			if installed {
				checkBase(t, pkg)
			}
		case "go", "optional":
			return
		default:
			t.Errorf("%s: unknown source %q", name, where)
			return
		}
		if !installed {
			return
		}
		path := name
		if !filepath.IsAbs(name) {
			p, err := exec.LookPath(name)
			if err != nil {
				t.Errorf("%s (package %s) is not on PATH after scripts/deps.sh: %v", name, pkg, err)
				return
			}
			path = p
		} else if _, err := os.Stat(name); err != nil {
			t.Errorf("%s (package %s) is missing after scripts/deps.sh: %v", name, pkg, err)
			return
		}
		paths[path] = pkg
	}
	for name, where := range programs {
		check(name, where)
	}
	for name, where := range absolutePrograms {
		check(name, where)
	}
	if !installed {
		return
	}
	owners := dpkgOwners(t, slices.Collect(maps.Keys(paths)))
	for path, want := range paths {
		if owners[path] != want {
			t.Errorf("%s is owned by package %q, not %s", path, owners[path], want)
		}
	}
}

// checkBase fails the test unless pkg is installed and Essential, or of
// Priority required.
func checkBase(t *testing.T, pkg string) {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Status}|${Essential}|${Priority}", pkg).Output()
	if err != nil {
		t.Errorf("base package %s: dpkg-query: %v", pkg, err)
		return
	}
	f := strings.Split(string(out), "|")
	if len(f) != 3 || !strings.HasSuffix(f[0], "installed") || (f[1] != "yes" && f[2] != "required") {
		t.Errorf("base package %s is %q: not Essential or required, so a fresh machine may lack it; install it in scripts/deps.sh", pkg, out)
	}
}

// dpkgOwners returns the package that installed each of paths (through
// symlinks and Debian's merged /usr), in one dpkg-query call.
func dpkgOwners(t *testing.T, paths []string) map[string]string {
	t.Helper()
	// Each path's names, best first: itself and its merged-/usr twin
	// (a symlink is its own package's), then what it points to.
	names := map[string][]string{}
	all := map[string]bool{}
	for _, p := range paths {
		ns := []string{p, usrTwin(p)}
		if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
			ns = append(ns, real, usrTwin(real))
		}
		names[p] = ns
		for _, n := range ns {
			all[n] = true
		}
	}
	// dpkg-query exits 1 when some name is unknown; what it found is
	// printed all the same.
	out, _ := exec.Command("dpkg-query", append([]string{"-S"}, slices.Collect(maps.Keys(all))...)...).Output()
	byName := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		pkgs, path, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(pkgs, "diversion ") {
			continue
		}
		pkg, _, _ := strings.Cut(strings.Split(pkgs, ", ")[0], ":")
		byName[path] = pkg
	}
	owners := map[string]string{}
	for p, ns := range names {
		for _, n := range ns {
			if pkg, ok := byName[n]; ok {
				owners[p] = pkg
				break
			}
		}
	}
	return owners
}

// usrTwin is p's other name under Debian's merged /usr (/bin ↔ /usr/bin).
func usrTwin(p string) string {
	if strings.HasPrefix(p, "/usr/") {
		return strings.TrimPrefix(p, "/usr")
	}
	return "/usr" + p
}

// depsLists reads the package arrays of scripts/deps.sh.
func depsLists(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^(\w+)=\(([^)]*)\)`).FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = strings.Fields(m[2])
	}
	for _, l := range []string{"runtime", "test"} {
		if len(out[l]) == 0 {
			t.Fatalf("scripts/deps.sh has no %s=(…) list", l)
		}
	}
	return out
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// programsInSources returns every program name the module's Go files run,
// with one place that runs it.
func programsInSources(t *testing.T, root string) map[string]string {
	t.Helper()
	type pkgFiles struct {
		fset  *token.FileSet
		files []*ast.File
	}
	pkgs := map[string]*pkgFiles{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		dir := filepath.Dir(p)
		pf := pkgs[dir]
		if pf == nil {
			pf = &pkgFiles{fset: token.NewFileSet()}
			pkgs[dir] = pf
		}
		f, err := parser.ParseFile(pf.fset, p, nil, 0)
		if err != nil {
			return err
		}
		pf.files = append(pf.files, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, pf := range pkgs {
		consts := map[string]string{}
		// wrappers: functions that run their parameter at this index.
		wrappers := map[string]int{}
		for _, f := range pf.files {
			ast.Inspect(f, func(n ast.Node) bool {
				if vs, ok := n.(*ast.ValueSpec); ok {
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								consts[name.Name] = s
							}
						}
					}
				}
				fd, ok := n.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					return true
				}
				var params []string
				for _, fl := range fd.Type.Params.List {
					for _, nm := range fl.Names {
						params = append(params, nm.Name)
					}
				}
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					if arg := programArg(n); arg != nil {
						if id, ok := arg.(*ast.Ident); ok {
							if i := slices.Index(params, id.Name); i >= 0 {
								wrappers[fd.Name.Name] = i
							}
						}
					}
					return true
				})
				return true
			})
		}
		for _, f := range pf.files {
			ast.Inspect(f, func(n ast.Node) bool {
				arg := programArg(n)
				if call, ok := n.(*ast.CallExpr); ok && arg == nil {
					if id, ok := call.Fun.(*ast.Ident); ok {
						if i, ok := wrappers[id.Name]; ok && i < len(call.Args) {
							arg = call.Args[i]
						}
					}
				}
				if arg == nil {
					return true
				}
				name, ok := stringLit(arg)
				if id, isID := arg.(*ast.Ident); !ok && isID {
					name, ok = consts[id.Name]
				}
				if ok && !strings.HasPrefix(name, "/proc/") {
					rel, _ := filepath.Rel(root, pf.fset.Position(arg.Pos()).String())
					found[name] = rel
				}
				return true
			})
		}
	}
	return found
}

// programArg returns the program argument of a call to exec.Command,
// exec.CommandContext or exec.LookPath, or nil.
func programArg(n ast.Node) ast.Expr {
	call, ok := n.(*ast.CallExpr)
	if !ok {
		return nil
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "exec" {
		return nil
	}
	i := map[string]int{"Command": 0, "CommandContext": 1, "LookPath": 0}[sel.Sel.Name]
	if _, ok := map[string]bool{"Command": true, "CommandContext": true, "LookPath": true}[sel.Sel.Name]; !ok || i >= len(call.Args) {
		return nil
	}
	return call.Args[i]
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}
