package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestTreeMark: a mark changes with any change under the root, a
// same-size overwrite of one byte right after the mark included, and
// only then.
func TestTreeMark(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "a", "b", "f")
	if err := os.WriteFile(f, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	mark := func() [32]byte {
		t.Helper()
		m, n, err := TreeMark(context.Background(), root)
		if err != nil || n != 3 {
			t.Fatalf("TreeMark: %d entries, %v", n, err)
		}
		return m
	}
	m0 := mark()
	if mark() != m0 {
		t.Fatal("two marks of an unchanged tree differ")
	}
	for _, change := range []struct {
		name string
		do   func() error
	}{
		{"same-size overwrite of one byte", func() error {
			fh, err := os.OpenFile(f, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer fh.Close()
			_, err = fh.WriteAt([]byte("j"), 0)
			return err
		}},
		{"chmod", func() error { return os.Chmod(f, 0o600) }},
		{"chmod of the top", func() error { return os.Chmod(dir, 0o700) }},
		{"rename", func() error { return os.Rename(f, f+"2") }},
	} {
		before := mark()
		if err := change.do(); err != nil {
			t.Fatal(err)
		}
		if mark() == before {
			t.Errorf("%s: the mark did not change", change.name)
		}
	}
}
