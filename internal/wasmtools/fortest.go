package wasmtools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
)

var forTest struct {
	once sync.Once
	dir  string
	err  error
}

// TB is the part of testing.TB that ForTest uses; taking it rather than
// testing.TB keeps package testing out of the dsec binary.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// ForTest returns the root of a default image for tests. It builds the
// image once per test binary into a cache directory keyed by a hash of the
// tool sources and the Go version
// (os.UserCacheDir()/dsec-wasmtools/<hash>), so repeated runs reuse it.
func ForTest(t TB) string {
	t.Helper()
	forTest.once.Do(func() {
		forTest.dir, forTest.err = buildCached(context.Background())
	})
	if forTest.err != nil {
		t.Fatalf("building the wasm tools: %v", forTest.err)
	}
	return forTest.dir
}

func buildCached(ctx context.Context) (string, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	key, err := sourceHash(root)
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "dsec-wasmtools", key)
	if fileExists(filepath.Join(dir, "complete")) {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), key+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := Build(ctx, tmp); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another test binary won the race; use its build.
		if fileExists(filepath.Join(dir, "complete")) {
			return dir, nil
		}
		return "", err
	}
	return dir, nil
}

// sourceHash hashes everything the image is built from.
func sourceHash(root string) (string, error) {
	h := sha256.New()
	h.Write([]byte(runtime.Version() + "\x00" + strings.Join(buildFlags, " ") + "\x00"))
	src := filepath.Join(root, "tools", "wasm", "dsectools")
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return "", err
		}
		h.Write([]byte(e.Name() + "\x00"))
		h.Write(b)
	}
	names := make([]string, 0, len(tiny.Modules))
	for n := range tiny.Modules {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		h.Write([]byte(n + "\x00"))
		h.Write(tiny.Bytes(tiny.Modules[n]))
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
