package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreate(t *testing.T) {
	dir := t.TempDir()
	tok, created, err := LoadOrCreate(dir)
	if err != nil || !created || !strings.HasPrefix(tok, "dsec_") || len(tok) < 40 {
		t.Fatalf("LoadOrCreate = %q, %v, %v", tok, created, err)
	}
	fi, err := os.Stat(filepath.Join(dir, TokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode = %v, %v; want 0600", fi.Mode(), err)
	}
	again, created, err := LoadOrCreate(dir)
	if err != nil || created || again != tok {
		t.Errorf("second LoadOrCreate = %q, %v, %v; want the same token", again, created, err)
	}
}

func TestChecker(t *testing.T) {
	c := NewChecker("dsec_a", "dsec_b")
	if o, ok := c.Check("dsec_b"); !ok || o != Owner("dsec_b") {
		t.Errorf("valid token refused")
	}
	for _, bad := range []string{"", "dsec_c", "dsec_a "} {
		if _, ok := c.Check(bad); ok {
			t.Errorf("Check(%q) accepted", bad)
		}
	}
	if Owner("x") == Owner("y") || strings.Contains(Owner("dsec_a"), "dsec_a") {
		t.Error("owners must differ and not contain the token")
	}
}
