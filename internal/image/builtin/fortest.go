package builtin

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/image/layer"
)

// TB is the part of testing.TB that DebianForTest uses; taking it rather
// than testing.TB keeps package testing out of the dsec binary.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

var debianForTest struct {
	once sync.Once
	art  layer.Artifact
	st   stamp
	took time.Duration
	err  error
}

// DebianForTest returns a base/debian-12 layer for tests, built at most
// once per machine per day: it is cached in
// os.UserCacheDir()/dsec-builtin/debian-12-<date>/ (shared by every test
// binary, which take turns through a lock file) and older days' builds
// are removed. Building takes tens of seconds to minutes and needs the
// Debian mirror and root; a failure fails the test.
func DebianForTest(t TB) layer.Artifact {
	t.Helper()
	d := &debianForTest
	d.once.Do(func() {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		base = filepath.Join(base, "dsec-builtin")
		date := today()
		start := time.Now()
		d.art, d.st, d.err = ensureAt(context.Background(), filepath.Join(base, "debian-12-"+date), debianSpec(date), slog.New(slog.DiscardHandler))
		d.took = time.Since(start)
		if d.err == nil {
			removeOldDebian(base, "debian-12-"+date)
		}
	})
	if d.err != nil {
		t.Fatalf("building the base/debian-12 layer: %v", d.err)
	}
	size := d.art.Manifest.Meta.Size + d.art.Manifest.Blob.Size
	if d.st.fresh {
		t.Logf("built base/debian-12 %s in %s (debootstrap and clean-up %.1fs, layer %.1fs): %s, %.1f MiB",
			d.st.Version, d.took.Round(time.Millisecond), d.st.FillSeconds, d.st.LayerSeconds, d.art.ID(), float64(size)/(1<<20))
	} else {
		t.Logf("using base/debian-12 %s built %s (it took %.1fs + %.1fs): %s, %.1f MiB",
			d.st.Version, d.st.Built.Format(time.RFC3339), d.st.FillSeconds, d.st.LayerSeconds, d.art.ID(), float64(size)/(1<<20))
	}
	return d.art
}

// removeOldDebian removes the other days' builds under base, best effort:
// a build another test binary still uses stays mounted and readable.
func removeOldDebian(base, keep string) {
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "debian-12-") && n != keep && !strings.HasSuffix(n, ".lock") {
			os.RemoveAll(filepath.Join(base, n))
			os.Remove(filepath.Join(base, n+".lock"))
		}
	}
}
