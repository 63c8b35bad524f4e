package sys

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteSmallFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := WriteSmallFile(p, []byte("first, longer"), 0o600, true); err != nil {
		t.Fatal(err)
	}
	if err := WriteSmallFile(p, []byte("x"), 0o600, true); !errors.Is(err, fs.ErrExist) {
		t.Errorf("excl over an existing file: %v, want ErrExist", err)
	}
	if err := WriteSmallFile(p, []byte("second"), 0o600, false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if err != nil || string(b) != "second" || fi.Mode().Perm() != 0o600 {
		t.Errorf("file = %q (%v), %v; want %q, 0600", b, fi.Mode(), err, "second")
	}
	if err := WriteSmallFile(filepath.Join(p, "under-a-file"), nil, 0o600, false); err == nil {
		t.Error("writing under a regular file succeeded")
	}
}
