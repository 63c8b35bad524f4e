package sys

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestCloneFileKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	chunk := bytes.Repeat([]byte("dsec"), 4096/4)
	for _, off := range []int64{0, 8 << 20, size - 4096} {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	cloned, err := CloneFile(dst, src, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("the copy differs (err %v)", err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; !cloned && used > 1<<20 {
		t.Errorf("the sparse copy of 12 KiB of data in %d MiB uses %d bytes", size>>20, used)
	}
}
