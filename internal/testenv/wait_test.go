package testenv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestWaitsBounded finds the waits in the module's test files that
// nothing bounds: a bare channel receive (`<-ch`, `v := <-ch`), or a
// Wait() call (sync.WaitGroup, exec.Cmd, os.Process), outside a select
// and outside a goroutine of its own (`go func() { … }()`, whose result
// a bounded wait receives). Each such wait hung its package until go
// test's 20-minute timeout when what it waited for never came. Use
// Recv, WaitGroup or WaitCmd (or a select with a timeout) instead; a
// wait that cannot block (a channel already closed or buffered just
// before) says so with a "// bounded: why" comment on its line or the
// line above.
func TestWaitsBounded(t *testing.T) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	var found []string
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") || p == filepath.Join(root, "internal/testenv/wait_test.go") {
			return nil
		}
		found = append(found, unboundedWaits(t, root, p)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("unbounded wait: %s", f)
	}
	// The control: the scan finds what it looks for.
	if n := len(unboundedWaits(t, root, filepath.Join(root, "internal/testenv/testdata/waits_test.go.txt"))); n != 4 {
		t.Errorf("the scan found %d unbounded waits in testdata/waits_test.go.txt, want 4", n)
	}
}

// unboundedWaits lists the unbounded waits of one test file.
func unboundedWaits(t *testing.T, root, path string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	excused := func(line int) bool {
		for _, l := range []int{line - 1, line - 2} { // this line and the one above
			if l >= 0 && l < len(lines) && strings.Contains(lines[l], "// bounded:") {
				return true
			}
		}
		return false
	}
	var out []string
	report := func(n ast.Node, what string) {
		pos := fset.Position(n.Pos())
		if excused(pos.Line) {
			return
		}
		rel, _ := filepath.Rel(root, pos.Filename)
		out = append(out, rel+":"+itoa(pos.Line)+": "+what)
	}
	var walk func(n ast.Node, inGo bool)
	walk = func(n ast.Node, inGo bool) {
		ast.Inspect(n, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				// A goroutine's own waits are bounded by whoever receives
				// its result; its arguments are evaluated here.
				for _, a := range n.Call.Args {
					walk(a, inGo)
				}
				if fl, ok := n.Call.Fun.(*ast.FuncLit); ok {
					walk(fl.Body, true)
				}
				return false
			case *ast.SelectStmt:
				// The cases' receives are the select's; their bodies are
				// not.
				for _, c := range n.Body.List {
					for _, s := range c.(*ast.CommClause).Body {
						walk(s, inGo)
					}
				}
				return false
			case *ast.UnaryExpr:
				if n.Op == token.ARROW && !inGo {
					report(n, "channel receive")
				}
			case *ast.RangeStmt:
				// `for range time.Tick(…)` and the like are not waits on
				// others; a range over a channel is found by its name.
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Wait" && len(n.Args) == 0 && !inGo {
					report(n, "Wait()")
				}
			}
			return true
		})
	}
	walk(f, false)
	return out
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}
