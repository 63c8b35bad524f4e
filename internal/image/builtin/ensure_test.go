package builtin

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestSpecs(t *testing.T) {
	specs := Specs(testVersion)
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
		if s.err != nil {
			t.Errorf("%s: %v", s.Name, s.err)
		}
		if s.Fill == nil || s.Version == "" || s.recipe == 0 {
			t.Errorf("%s: incomplete spec %+v", s.Name, s)
		}
		if want := strings.Split(s.Name, "/")[0]; s.Role != want {
			t.Errorf("%s: role %q, want %q", s.Name, s.Role, want)
		}
		if s.Slow != (s.Name == Debian12) || s.Dated != (s.Name == Debian12) {
			t.Errorf("%s: Slow %v, Dated %v", s.Name, s.Slow, s.Dated)
		}
		wantTiers := "container microvm vm"
		if s.Name == WasmTools {
			wantTiers = api.TierFunction
		}
		if got := strings.Join(s.Tiers, " "); got != wantTiers {
			t.Errorf("%s: tiers %q, want %q", s.Name, got, wantTiers)
		}
		t.Logf("%s %s", s.Name, s.Version)
	}
	if got := strings.Join(names, " "); got != "base/busybox toolkit/dsec-guest toolkit/wasm-tools base/debian-12" {
		t.Errorf("specs %q", got)
	}
	for name, pattern := range map[string]string{
		Busybox:   `^1:1\.[0-9.]+-`, // Debian's busybox-static version, with its epoch
		Guest:     `^test-[0-9a-f]{12}$`,
		WasmTools: `^[0-9a-f]{12}$`,
		Debian12:  `^20[0-9]{2}\.[01][0-9]\.[0-3][0-9]$`,
	} {
		if v := spec(t, name).Version; !regexp.MustCompile(pattern).MatchString(v) {
			t.Errorf("%s version %q does not match %s", name, v, pattern)
		}
	}
}

// TestEnsureReproducible builds each fast built-in layer twice in one
// cache (the second call must reuse the first build) and once in another
// (same layer ID: the trees are reproducible).
func TestEnsureReproducible(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	for _, name := range []string{Busybox, Guest, WasmTools} {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			s := spec(t, name)
			a, b := t.TempDir(), t.TempDir()
			start := time.Now()
			art, err := Ensure(ctx, a, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			first := time.Since(start)
			if want := filepath.Join(a, filepath.FromSlash(name), dirName(s.Version)); art.Dir != want {
				t.Errorf("artifact in %s, want %s", art.Dir, want)
			}
			if err := layer.Validate(ctx, art); err != nil {
				t.Fatal(err)
			}
			st := readStamp(t, art.Dir)
			start = time.Now()
			again, err := Ensure(ctx, a, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			second := time.Since(start)
			if again.ID() != art.ID() || again.Dir != art.Dir {
				t.Errorf("second Ensure gave %s in %s, want %s in %s", again.ID(), again.Dir, art.ID(), art.Dir)
			}
			if st2 := readStamp(t, art.Dir); !st2.Built.Equal(st.Built) {
				t.Errorf("second Ensure rebuilt the layer (built %v, then %v)", st.Built, st2.Built)
			}
			if second > first/2 && second > 50*time.Millisecond {
				t.Errorf("second Ensure took %v, the build %v", second, first)
			}
			other, err := Ensure(ctx, b, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if other.ID() != art.ID() {
				t.Errorf("built in another cache: %s, want %s", other.ID(), art.ID())
			}
			size := art.Manifest.Meta.Size + art.Manifest.Blob.Size
			t.Logf("%s %s: %s, %d bytes (meta %d + blob %d); build %v (fill %.3fs, layer %.3fs), reuse %v",
				name, s.Version, art.ID(), size, art.Manifest.Meta.Size, art.Manifest.Blob.Size,
				first.Round(time.Millisecond), st.FillSeconds, st.LayerSeconds, second.Round(time.Microsecond))
		})
	}
}

// tinySpec is a spec whose Fill writes one file and counts its calls.
func tinySpec(calls *atomic.Int32) Spec {
	return Spec{
		Name: "test/tiny", Version: "1:0+x", Role: RoleBase, recipe: 1,
		Fill: func(ctx context.Context, dir string) error {
			calls.Add(1)
			return tree{dir}.file("hello", []byte("hello\n"), 0o644)
		},
	}
}

func TestEnsureRebuildsInvalid(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, dir string, s *Spec)
	}{
		{name: "blob changed", spoil: func(t *testing.T, dir string, s *Spec) {
			appendTo(t, filepath.Join(dir, layer.BlobFile), "x")
		}},
		{name: "meta truncated", spoil: func(t *testing.T, dir string, s *Spec) {
			if err := os.Truncate(filepath.Join(dir, layer.MetaFile), 100); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "manifest missing", spoil: func(t *testing.T, dir string, s *Spec) {
			if err := os.Remove(filepath.Join(dir, layer.ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "stamp missing", spoil: func(t *testing.T, dir string, s *Spec) {
			if err := os.Remove(filepath.Join(dir, stampFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "new recipe", spoil: func(t *testing.T, dir string, s *Spec) { s.recipe++ }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			s, cache := tinySpec(&calls), t.TempDir()
			art, err := Ensure(ctx, cache, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if base := filepath.Base(art.Dir); base != "1_0+x" {
				t.Errorf("version directory %q, want 1_0+x", base)
			}
			tc.spoil(t, art.Dir, &s)
			again, err := Ensure(ctx, cache, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if calls.Load() != 2 {
				t.Errorf("Fill ran %d times, want 2 (a rebuild)", calls.Load())
			}
			if again.ID() != art.ID() {
				t.Errorf("rebuilt %s, want %s", again.ID(), art.ID())
			}
			if err := layer.Validate(ctx, again); err != nil {
				t.Error(err)
			}
			leftovers(t, filepath.Dir(art.Dir))
		})
	}
}

// TestEnsureOnce runs Ensure from several goroutines at once: one builds,
// the others wait for it and reuse its build.
func TestEnsureOnce(t *testing.T) {
	needRoot(t)
	var calls atomic.Int32
	s, cache := tinySpec(&calls), t.TempDir()
	var wg sync.WaitGroup
	ids := make([]string, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			art, err := Ensure(context.Background(), cache, s, nil)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = art.ID()
		}()
	}
	testenv.WaitGroup(t, &wg, 5*time.Minute, "the concurrent Ensure calls")
	if calls.Load() != 1 {
		t.Errorf("Fill ran %d times, want 1", calls.Load())
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Errorf("IDs differ: %q", ids)
		}
	}
}

func TestEnsureFailure(t *testing.T) {
	cache := t.TempDir()
	boom := errors.New("boom")
	s := Spec{Name: "test/fail", Version: "1", recipe: 1, Fill: func(ctx context.Context, dir string) error { return boom }}
	if _, err := Ensure(context.Background(), cache, s, nil); !errors.Is(err, boom) {
		t.Errorf("Ensure: %v, want %v", err, boom)
	}
	leftovers(t, filepath.Join(cache, "test", "fail"))
	if _, err := os.Stat(filepath.Join(cache, "test", "fail", "1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed build left its directory: %v", err)
	}
	s.err = errNoBusybox
	if _, err := Ensure(context.Background(), cache, s, nil); !errors.Is(err, errNoBusybox) {
		t.Errorf("Ensure of an unavailable spec: %v", err)
	}
}

// TestEnsureDated checks that a Dated spec reuses the newest cached build
// of any day rather than building again.
func TestEnsureDated(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	var calls atomic.Int32
	cache := t.TempDir()
	s := tinySpec(&calls)
	s.Dated = true
	var arts []layer.Artifact
	for _, v := range []string{"2026.01.01", "2026.01.02"} {
		s.Version = v
		art, _, err := ensureAt(ctx, filepath.Join(cache, "test", "tiny", v), s, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		arts = append(arts, art)
	}
	s.Version = "2026.02.01"
	if got := Resolve(cache, s).Version; got != "2026.01.02" {
		t.Errorf("Resolve: version %q, want 2026.01.02", got)
	}
	art, err := Ensure(ctx, cache, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if art.Dir != arts[1].Dir || calls.Load() != 2 {
		t.Errorf("Ensure used %s after %d builds, want %s after 2", art.Dir, calls.Load(), arts[1].Dir)
	}
	// A stale recipe is not reused.
	s.recipe++
	if got := Resolve(cache, s).Version; got != "2026.02.01" {
		t.Errorf("Resolve with a new recipe: version %q, want 2026.02.01", got)
	}
}

func TestDirName(t *testing.T) {
	for _, tc := range []struct{ name, version, want string }{
		{"debian epoch", "1:1.35.0-4+deb12u1+b1", "1_1.35.0-4+deb12u1+b1"},
		{"date", "2026.11.30", "2026.11.30"},
		{"slash", "v1/2", "v1_2"},
		{"empty", "", "_"},
		{"dots", "..", "_.."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dirName(tc.version); got != tc.want {
				t.Errorf("dirName(%q) = %q, want %q", tc.version, got, tc.want)
			}
		})
	}
}

func appendTo(t *testing.T, p, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// leftovers fails if a build left temporary directories in dir.
func leftovers(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary %s left in %s", e.Name(), dir)
		}
	}
}
