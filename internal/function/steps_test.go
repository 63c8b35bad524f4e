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
	// A change through the files API between steps counts against the
	// next one (a step begins where the last one ended).
	if err := sb.Files().Remove(ctx, "/workspace/new", false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []bool{false, true} {
		m, err := sb.BeginStep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		run(t, sb, "", "echo", "ok")
		if pure, _, _ := sb.EndStep(ctx, m); pure != want {
			t.Errorf("an echo after a remove between steps: pure=%v, want %v", pure, want)
		}
	}
}
