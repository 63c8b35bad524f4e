package image

import (
	"context"
	"errors"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestNormalize(t *testing.T) {
	good := map[string]string{"wasm-tools": "wasm-tools:latest", "base/debian-12:2026.11": "base/debian-12:2026.11"}
	for in, want := range good {
		if got, err := Normalize(in); err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "UPPER", "a/../b", "a b", "x:", "/abs", "trailing/", "a:b:c"} {
		if _, err := Normalize(bad); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Normalize(%q): err = %v, want Invalid", bad, err)
		}
	}
}

func TestAddDirAndResolve(t *testing.T) {
	nc, _ := testenv.NATS(t)
	st, err := store.Open(context.Background(), nc, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := New(st)
	ctx := context.Background()
	dir := t.TempDir()
	rec, err := r.AddDir(ctx, "tools", dir, []string{"function"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Name != "tools:latest" || rec.Source != "dir:"+dir || len(rec.ID) != len("sha256:")+64 {
		t.Errorf("AddDir = %+v", rec)
	}
	for _, ref := range []string{"tools", "tools:latest", rec.ID} {
		got, err := r.Resolve(ctx, ref)
		if err != nil || got.ID != rec.ID {
			t.Errorf("Resolve(%q) = %+v, %v", ref, got, err)
		}
	}
	if _, err := r.Resolve(ctx, "nope"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Resolve(unknown): err = %v, want NotFound", err)
	}
	if _, err := r.AddDir(ctx, "x", dir+"/missing", nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("AddDir(missing dir): err = %v, want NotFound", err)
	}
	if _, err := r.AddDir(ctx, "x", "relative/dir", nil); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("AddDir(relative): err = %v, want Invalid", err)
	}
	if !Supports(rec, "function") || Supports(rec, "container") {
		t.Errorf("Supports wrong for tiers %v", rec.Tiers)
	}
}

func TestResolveSeesReplacement(t *testing.T) {
	nc, _ := testenv.NATS(t)
	st, err := store.Open(context.Background(), nc, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := New(st)
	ctx := context.Background()
	a, _ := r.AddDir(ctx, "img", t.TempDir(), nil)
	if got, _ := r.Resolve(ctx, "img"); got.ID != a.ID {
		t.Fatalf("Resolve = %s, want %s", got.ID, a.ID)
	}
	b, _ := r.AddDir(ctx, "img", t.TempDir(), nil)
	if got, _ := r.Resolve(ctx, "img"); got.ID != b.ID || b.ID == a.ID {
		t.Errorf("after re-adding, Resolve = %s, want %s (old %s)", got.ID, b.ID, a.ID)
	}
}
