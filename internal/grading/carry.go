package grading

import (
	"path"
	"strings"

	"github.com/dsec-dev/dsec/internal/audit"
)

// DefaultProtected are the files a grading never takes from the agent:
// what changes how tests are collected or run (R4, R15), code every
// Python process runs at start (R4, A61), compiled bytecode that would
// shadow the sources, and result files a grader might mistake for its
// own (R8). Where the image has such a file, the grading sees the image's.
var DefaultProtected = []string{
	"**/conftest.py", "**/pytest.ini", "**/tox.ini", "**/setup.cfg", "**/.coveragerc",
	"**/sitecustomize.py", "**/usercustomize.py", "**/*.pth",
	"**/__pycache__/**", "**/*.pyc", "**/.pytest_cache/**",
	"**/junit*.xml", "**/results.json", "**/report.json",
}

// Filter decides which of the agent's files a grading copies.
type Filter struct {
	// Sealed are directories the tests layer owns; Protected glob
	// patterns; ReportDir the grader's report directory.
	Sealed    []string
	Protected []string
	ReportDir string
	// Provided are the paths the tests layer has, each mapped to whether
	// it is a directory. The layer's copy of a path always wins, in any
	// language's layout (a Go package's x_test.go, a JavaScript
	// x.test.js beside the code): the agent's is never carried, unless
	// both are directories (their contents are judged one by one).
	Provided map[string]bool
}

// Keep reports whether the file at p (absolute, clean) of type typ
// ("file", "dir", "symlink"…) is carried, and if not, why.
func (f *Filter) Keep(p, typ string) (bool, string) {
	if typ != "file" && typ != "dir" {
		return false, typ
	}
	if dir, ok := f.Provided[p]; ok && !(dir && typ == "dir") {
		return false, "tests layer"
	}
	for _, s := range append(f.Sealed, f.ReportDir) {
		if s != "" && (p == s || strings.HasPrefix(p, strings.TrimSuffix(s, "/")+"/")) {
			return false, "sealed"
		}
	}
	if typ == "file" {
		for _, pat := range f.Protected {
			if audit.MatchPath(pat, p) {
				return false, "protected"
			}
		}
	}
	return true, ""
}

// Under reports whether p is dir or below it.
func Under(p, dir string) bool {
	p, dir = path.Clean(p), path.Clean(dir)
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}
