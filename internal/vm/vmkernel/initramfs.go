package vmkernel

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/guest/vminit"
)

// initramfsRecipe versions the archive's layout; it is part of the key.
// 2: uncompressed (gzip until 1).
const initramfsRecipe = 2

// Initramfs returns the path of the uncompressed newc initramfs for
// kernel k and the guest init program init (dsec-guest), building it into
// cacheDir/initramfs/<key>.cpio if it is not there. It is not compressed:
// under TCG the guest's gunzip of the ~5 MB archive costs ~100 ms of every
// boot, the space ~3 MB once per cache. The key is the
// SHA-256 of the recipe, k's manifest and init, so equal inputs share one
// file. It is written to a temporary file and renamed: concurrent callers
// may both build it, and either result is the same bytes.
func Initramfs(cacheDir string, k Kernel, init []byte) (string, error) {
	key, err := initramfsKey(k, init)
	if err != nil {
		return "", err
	}
	p := filepath.Join(cacheDir, "initramfs", key+".cpio")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	b, err := BuildInitramfs(k, init)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*.cpio")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return "", err
	}
	return p, nil
}

func initramfsKey(k Kernel, init []byte) (string, error) {
	manifest, err := os.ReadFile(filepath.Join(k.Dir, "manifest.json"))
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "dsec initramfs %d\nmanifest %x\ninit %x\n", initramfsRecipe, sha256.Sum256(manifest), sha256.Sum256(init))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// BuildInitramfs returns the initramfs archive: /init (init, 0755),
// /lib/modules/<release>/<name>.ko for k's modules, vminit.ModulesList
// naming them in load order, /dev/console, and empty /proc, /sys, /tmp.
// The same inputs give the same bytes.
func BuildInitramfs(k Kernel, init []byte) ([]byte, error) {
	entries := []cpioEntry{
		{Name: "init", Mode: 0o755, Data: init},
		{Name: "dev", Mode: cpioDir | 0o755},
		// The kernel opens /dev/console for init's stdio before anything
		// mounts devtmpfs.
		{Name: "dev/console", Mode: cpioChar | 0o600, Major: 5, Minor: 1},
		{Name: "proc", Mode: cpioDir | 0o755},
		{Name: "sys", Mode: cpioDir | 0o755},
		{Name: "tmp", Mode: cpioDir | 0o1777},
	}
	var list strings.Builder
	dir := path.Join("lib/modules", k.Release)
	for _, m := range k.Modules {
		b, err := os.ReadFile(filepath.Join(k.Dir, m.Path))
		if err != nil {
			return nil, err
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != m.SHA256 {
			return nil, fmt.Errorf("cached module %s: digest mismatch", m.Name)
		}
		p := path.Join(dir, m.Name+".ko")
		entries = append(entries, cpioEntry{Name: p, Mode: 0o644, Data: b})
		fmt.Fprintf(&list, "/%s\n", p)
	}
	entries = append(entries, cpioEntry{Name: vminit.ModulesList, Mode: 0o644, Data: []byte(list.String())})
	return cpioArchive(entries)
}
