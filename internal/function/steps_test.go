package function

import (
	"context"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestPureSteps checks that function calls that read are pure and those
// that write the workspace are not, a same-size overwrite included.
func TestPureSteps(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	sb := create(t, rt, nil)
	ctx := context.Background()
	if _, err := sb.Files().Write(ctx, "/workspace/f", strings.NewReader("hello"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stdin string
		argv  []string
		pure  bool
	}{
		{"", []string{"ls", "/workspace"}, true},
		{"", []string{"cat", "/workspace/f"}, true},
		{"", []string{"exit", "3"}, true},
		{"", []string{"cat", "/workspace/missing"}, true},
		{"hellp", []string{"write", "/workspace/f"}, false}, // same size, one byte differs
		{"x", []string{"write", "/workspace/new"}, false},
		{"", []string{"echo", "ok"}, true},
	} {
		m, err := sb.BeginStep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		run(t, sb, tc.stdin, tc.argv...)
		pure, why, err := sb.EndStep(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if pure != tc.pure || (!pure && why != sandbox.WhyWrites) {
			t.Errorf("%q: pure=%v why=%q, want pure=%v", tc.argv, pure, why, tc.pure)
		}
	}
	// A change through the files API shows too (the control plane does
	// not ask, but the mark must see it).
	m, _ := sb.BeginStep(ctx)
	if err := sb.Files().Remove(ctx, "/workspace/new", false); err != nil {
		t.Fatal(err)
	}
	if pure, _, _ := sb.EndStep(ctx, m); pure {
		t.Error("a remove was pure")
	}
}
