package errdefs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

const (
	modulePath  = "github.com/dsec-dev/dsec"
	apiPath     = modulePath + "/api"
	errdefsPath = modulePath + "/internal/errdefs"
)

// classNames are the classes by the names of their constants here.
var classNames = map[string]Class{"Invalid": Invalid, "Unauthenticated": Unauthenticated,
	"PermissionDenied": PermissionDenied, "NotFound": NotFound, "Conflict": Conflict, "TooLarge": TooLarge,
	"Unsupported": Unsupported, "RateLimited": RateLimited, "Unavailable": Unavailable,
	"DeadlineExceeded": DeadlineExceeded, "Internal": Internal}

// codeChecker finds, in Go source, error codes that are not constants of
// the api package's registry, codes the registry lacks, and codes used
// with another class than their registered one. It reads source only
// (go/ast, no type checking): a code is followed through constants, by
// name, to the string that defines it; a code computed at run time (a
// variable, a field, a call) is not checked.
type codeChecker struct {
	fset  *token.FileSet
	files []goFile
	// consts holds the package-level constants, by "importpath.Name".
	consts map[string]constDef
	// codeParams holds the functions that take a parameter named code,
	// by "importpath.Name", with its index.
	codeParams map[string]int
	registry   map[string]Class
}

type goFile struct {
	pkg  string
	file *ast.File
}

type constDef struct {
	value ast.Expr
	file  goFile
}

func newCodeChecker() *codeChecker {
	c := &codeChecker{fset: token.NewFileSet(), consts: map[string]constDef{}, codeParams: map[string]int{},
		registry: map[string]Class{}}
	for _, e := range api.ErrorCodes {
		c.registry[e.Code] = Class(e.Class)
	}
	return c
}

// add parses one file of package pkg (an import path).
func (c *codeChecker) add(pkg, name string, src any) error {
	f, err := parser.ParseFile(c.fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	gf := goFile{pkg, f}
	c.files = append(c.files, gf)
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			if d.Tok != token.CONST {
				continue
			}
			for _, s := range d.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						c.consts[pkg+"."+n.Name] = constDef{vs.Values[i], gf}
					}
				}
			}
		case *ast.FuncDecl:
			if d.Recv != nil {
				continue
			}
			i := 0
			for _, p := range d.Type.Params.List {
				for _, n := range p.Names {
					if n.Name == "code" {
						c.codeParams[pkg+"."+d.Name.Name] = i
					}
					i++
				}
			}
		}
	}
	return nil
}

// addTree adds every non-test Go file under root, the directory of the
// package whose import path is pkg.
func (c *codeChecker) addTree(root, pkg string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (d.Name() == "testdata" || d.Name() == "sdk" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		return c.add(path.Join(pkg, filepath.ToSlash(rel)), p, nil)
	})
}

// imported returns the import path that name stands for in f, or "".
func imported(f *ast.File, name string) string {
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		local := path.Base(p)
		if im.Name != nil {
			local = im.Name.Name
		}
		if local == name {
			return p
		}
	}
	return ""
}

// resolve follows e, an expression in f, through constants to the string
// literal that defines it: its value, the package that holds it, and
// false if e is computed at run time.
func (c *codeChecker) resolve(f goFile, e ast.Expr) (value, pkg string, ok bool) {
	for range 16 { // constants chain only so far
		var key string
		switch x := e.(type) {
		case *ast.BasicLit:
			if x.Kind != token.STRING {
				return "", "", false
			}
			v, err := strconv.Unquote(x.Value)
			return v, f.pkg, err == nil
		case *ast.ParenExpr:
			e = x.X
			continue
		case *ast.Ident:
			key = f.pkg + "." + x.Name
		case *ast.SelectorExpr:
			id, isID := x.X.(*ast.Ident)
			if !isID {
				return "", "", false
			}
			p := imported(f.file, id.Name)
			if p == "" {
				return "", "", false
			}
			key = p + "." + x.Sel.Name
		default:
			return "", "", false
		}
		d, found := c.consts[key]
		if !found {
			return "", "", false
		}
		e, f = d.value, d.file
	}
	return "", "", false
}

// class returns the class e names (errdefs.NotFound, or NotFound within
// this package), if it names one.
func (c *codeChecker) class(f goFile, e ast.Expr) (Class, bool) {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok && imported(f.file, id.Name) == errdefsPath {
			cl, ok := classNames[x.Sel.Name]
			return cl, ok
		}
	case *ast.Ident:
		if f.pkg == errdefsPath {
			cl, ok := classNames[x.Name]
			return cl, ok
		}
	}
	return "", false
}

// isCode reports whether e reads an error's code: errdefs.CodeOf(…) or a
// field named Code.
func isCode(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.CallExpr:
		if s, ok := x.Fun.(*ast.SelectorExpr); ok {
			return s.Sel.Name == "CodeOf"
		}
		if id, ok := x.Fun.(*ast.Ident); ok {
			return id.Name == "CodeOf"
		}
	case *ast.SelectorExpr:
		return x.Sel.Name == "Code"
	}
	return false
}

// check returns the problems found, each as "file:line: what".
func (c *codeChecker) check() []string {
	var out []string
	report := func(n ast.Node, format string, args ...any) {
		p := c.fset.Position(n.Pos())
		out = append(out, fmt.Sprintf("%s:%d: %s", p.Filename, p.Line, fmt.Sprintf(format, args...)))
	}
	// use checks a code given where one is expected, with the class it
	// comes with if that is known.
	use := func(f goFile, code ast.Expr, class ast.Expr) {
		v, pkg, ok := c.resolve(f, code)
		switch {
		case !ok || v == "" && pkg != apiPath:
			return
		case pkg != apiPath:
			if _, reg := c.registry[v]; reg {
				report(code, "code %q is a string, not its constant in package api", v)
			} else {
				report(code, "code %q is not in api.ErrorCodes", v)
			}
			return
		}
		want, reg := c.registry[v]
		if !reg {
			report(code, "code %q is not in api.ErrorCodes", v)
			return
		}
		if class == nil {
			return
		}
		if got, ok := c.class(f, class); ok && got != want {
			report(code, "code %q is registered with class %s, used with %s", v, want, got)
		}
	}
	for _, f := range c.files {
		if f.pkg == apiPath {
			continue
		}
		ast.Inspect(f.file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				var key string
				switch fn := n.Fun.(type) {
				case *ast.SelectorExpr:
					if id, ok := fn.X.(*ast.Ident); ok {
						if p := imported(f.file, id.Name); p != "" {
							key = p + "." + fn.Sel.Name
						}
					}
				case *ast.Ident:
					key = f.pkg + "." + fn.Name
				}
				switch key {
				case errdefsPath + ".New", errdefsPath + ".Wrap", errdefsPath + ".Within":
					if len(n.Args) > 1 {
						use(f, n.Args[1], n.Args[0])
					}
				default:
					if i, ok := c.codeParams[key]; ok && i < len(n.Args) {
						use(f, n.Args[i], nil)
					}
				}
			case *ast.CompositeLit:
				s, ok := n.Type.(*ast.SelectorExpr)
				if !ok || s.Sel.Name != "Error" {
					return true
				}
				if id, ok := s.X.(*ast.Ident); !ok || imported(f.file, id.Name) != errdefsPath {
					return true
				}
				var code, class ast.Expr
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						switch kv.Key.(*ast.Ident).Name {
						case "Code":
							code = kv.Value
						case "Class":
							class = kv.Value
						}
					}
				}
				if code != nil {
					use(f, code, class)
				}
			case *ast.BinaryExpr:
				if n.Op == token.EQL || n.Op == token.NEQ {
					if isCode(n.X) {
						use(f, n.Y, nil)
					}
					if isCode(n.Y) {
						use(f, n.X, nil)
					}
				}
			case *ast.SwitchStmt:
				if n.Tag == nil || !isCode(n.Tag) {
					return true
				}
				for _, s := range n.Body.List {
					for _, e := range s.(*ast.CaseClause).List {
						use(f, e, nil)
					}
				}
			case *ast.ValueSpec:
				// A constant outside api that spells a registered code
				// is a second definition of it.
				for _, v := range n.Values {
					if bl, ok := v.(*ast.BasicLit); ok && bl.Kind == token.STRING {
						s, _ := strconv.Unquote(bl.Value)
						if _, reg := c.registry[s]; reg && strings.HasPrefix(n.Names[0].Name, "Code") {
							report(bl, "code %q is defined again; use its constant in package api", s)
						}
					}
				}
			}
			return true
		})
	}
	sort.Strings(out)
	return out
}

// TestCodesAreRegistered: every error code in the module's Go code is a
// constant of api's registry, used with its registered class.
func TestCodesAreRegistered(t *testing.T) {
	c := newCodeChecker()
	if err := c.addTree("../..", modulePath); err != nil {
		t.Fatal(err)
	}
	if len(c.files) < 100 {
		t.Fatalf("only %d files found", len(c.files))
	}
	for _, p := range c.check() {
		t.Error(p)
	}
}

func TestCodeCheckerFails(t *testing.T) {
	c := newCodeChecker()
	if err := c.addTree("../../api", apiPath); err != nil {
		t.Fatal(err)
	}
	src := `package bad

import (
	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

const CodeLocal = "sandbox_not_found"

const codeAlias = wire.CodeSandboxNotFound

func wrap(code string, err error) error { return err }

func f(err error) error {
	_ = errdefs.New(errdefs.NotFound, wire.CodeSandboxNotFound, "fine")
	_ = errdefs.Wrap(errdefs.NotFound, codeAlias, err, "fine")
	_ = errdefs.New(errdefs.NotFound, "sandbox_not_found", "literal")
	_ = errdefs.New(errdefs.NotFound, CodeLocal, "local")
	_ = errdefs.New(errdefs.NotFound, "no_such_code", "unregistered")
	_ = errdefs.Within(errdefs.Conflict, wire.CodeSandboxNotFound, err, "class")
	_ = &errdefs.Error{Class: errdefs.Internal, Code: codeAlias}
	_ = wrap("file_not_found", err)
	if errdefs.CodeOf(err) == "sandbox_not_found" {
	}
	switch errdefs.CodeOf(err) {
	case wire.CodeFileNotFound, "file_exists":
	}
	return nil
}
`
	if err := c.add("example.com/bad", "bad.go", src); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range c.check() {
		if strings.HasPrefix(p, "bad.go:") {
			got = append(got, p)
		}
	}
	want := []string{
		`bad.go:17: code "sandbox_not_found" is a string, not its constant in package api`,
		`bad.go:18: code "sandbox_not_found" is a string, not its constant in package api`,
		`bad.go:19: code "no_such_code" is not in api.ErrorCodes`,
		`bad.go:20: code "sandbox_not_found" is registered with class not_found, used with conflict`,
		`bad.go:21: code "sandbox_not_found" is registered with class not_found, used with internal`,
		`bad.go:22: code "file_not_found" is a string, not its constant in package api`,
		`bad.go:23: code "sandbox_not_found" is a string, not its constant in package api`,
		`bad.go:26: code "file_exists" is a string, not its constant in package api`,
		`bad.go:8: code "sandbox_not_found" is defined again; use its constant in package api`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRegistryClassesExist: every registered class is one of Classes.
func TestRegistryClassesExist(t *testing.T) {
	for _, e := range api.ErrorCodes {
		if ParseClass(e.Class) != Class(e.Class) {
			t.Errorf("%s: class %q is not an errdefs class", e.Code, e.Class)
		}
	}
}
