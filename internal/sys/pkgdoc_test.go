package sys

import (
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs requires every package of the module to say what it is
// for in exactly one "// Package x …" comment (a rule enforced by a test:
// docs/design/conventions.md). Commands (package main) are exempt from the "Package x" form
// but still need a doc comment.
func TestPackageDocs(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}} {{.Name}} {{join .GoFiles \" \"}}", "github.com/dsec-dev/dsec/...").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		dir, name, files := f[0], f[1], f[2:]
		docs := 0
		for _, file := range files {
			pf, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, file), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if pf.Doc == nil {
				continue
			}
			text := pf.Doc.Text()
			if name == "main" && strings.HasPrefix(text, "Command ") || strings.HasPrefix(text, "Package "+name+" ") {
				docs++
			}
		}
		if docs != 1 {
			t.Errorf("%s (package %s) has %d package doc comments, want 1", dir, name, docs)
		}
	}
}
