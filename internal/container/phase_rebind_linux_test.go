package container

import (
	"context"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestPhaseSharedWritablePath moves between phases whose writable paths
// overlap: the same path in both (a mount point while bound), and a path
// under an earlier one. Each change must apply, with the paths writable
// and the rest of the root read-only.
func TestPhaseSharedWritablePath(t *testing.T) {
	dir := t.TempDir()
	rt := newRuntime(t, dir, runtimeOptions{pool: 2})
	ctx := context.Background()
	a := api.Phase{Name: "a", Writable: []string{"/workspace"}}
	b := api.Phase{Name: "b", Writable: []string{"/workspace", "/tmp"}}
	c := api.Phase{Name: "c", Writable: []string{"/workspace/sub"}}
	created, err := rt.Create(ctx, sandbox.Spec{ID: "rebind", Image: world.image(), Phases: []api.Phase{{Name: "s"}, a, b, c}})
	if err != nil {
		t.Fatal(err)
	}
	defer created.Destroy(ctx)
	sb := created.(*Sandbox)
	run := func(script string) string {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(script)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Stdout
	}
	probe := func(paths ...string) string {
		var b strings.Builder
		for _, p := range paths {
			b.WriteString(run("touch " + p + "/probe 2>/dev/null && echo w || echo r"))
		}
		return b.String()
	}
	run("mkdir -p /workspace/sub")
	for _, tc := range []struct {
		phase api.Phase
		want  string // /workspace, /tmp, /etc, /workspace/sub
	}{
		{a, "w\nr\nr\nw\n"},
		{b, "w\nw\nr\nw\n"},
		{c, "r\nr\nr\nw\n"},
	} {
		if err := sb.SetPhase(ctx, tc.phase); err != nil {
			t.Fatalf("SetPhase(%s): %v", tc.phase.Name, err)
		}
		if got := probe("/workspace", "/tmp", "/etc", "/workspace/sub"); got != tc.want {
			t.Errorf("phase %s: writable /workspace, /tmp, /etc, /workspace/sub = %q, want %q", tc.phase.Name, got, tc.want)
		}
	}
}
