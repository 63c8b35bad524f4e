package sys

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOnlySysImportsUnix keeps golang.org/x/sys/unix out of every package
// but this one (one gateway for syscalls: docs/design/conventions.md).
func TestOnlySysImportsUnix(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/dsec-dev/dsec/...").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		if pkg == "github.com/dsec-dev/dsec/internal/sys" {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if imp == "golang.org/x/sys/unix" {
				t.Errorf("%s imports golang.org/x/sys/unix; use internal/sys", pkg)
			}
		}
	}
}
