package function

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestPhases: the phase decides which workspace paths modules and the
// files API may write; results name the phase; a change ends the calls
// of the earlier phase.
func TestPhases(t *testing.T) {
	rt := newRuntime(t, t.TempDir(), Options{})
	ctx := context.Background()
	phases := []api.Phase{
		{Name: "coding", Writable: []string{"/workspace/src"}},
		{Name: "submit", Writable: []string{}},
	}
	sb := create(t, rt, func(s *sandbox.Spec) { s.Phases = phases })
	if _, err := sb.Files().Mkdir(ctx, "/workspace/src", false); err != nil {
		t.Fatal(err)
	}
	res := run(t, sb, "a", "write", "/workspace/src/a")
	if res.ExitCode != 0 || res.Phase != "coding" {
		t.Errorf("writing under a writable path: %+v", res)
	}
	// The control for the denials below: the same write outside it.
	res = run(t, sb, "b", "write", "/workspace/b")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
		t.Errorf("writing outside the writable paths: %+v", res)
	}
	if _, err := sb.Files().Write(ctx, "/workspace/c", bytes.NewReader([]byte("c")), sandbox.WriteOptions{}); errdefs.CodeOf(err) != "read_only_path" {
		t.Errorf("the files API outside the writable paths: %v", err)
	}
	if _, err := sb.Files().Write(ctx, "/workspace/src/c", bytes.NewReader([]byte("c")), sandbox.WriteOptions{}); err != nil {
		t.Errorf("the files API under a writable path: %v", err)
	}
	// A call of the earlier phase is ended by the change.
	slept := make(chan api.ExecResult, 1)
	go func() {
		res, _ := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "30"}, TimeoutS: 60}})
		slept <- res
	}()
	for sb.running.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := sb.SetPhase(ctx, phases[1]); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-slept:
		if res.Error != "killed" || res.Phase != "coding" {
			t.Errorf("a call across the change: %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call of the earlier phase outlives the change by 10 s")
	}
	res = run(t, sb, "a2", "write", "/workspace/src/a")
	if res.ExitCode == 0 || res.Phase != "submit" {
		t.Errorf("writing in submit: %+v", res)
	}
	if err := sb.Files().Remove(ctx, "/workspace/src/a", false); errdefs.CodeOf(err) != "read_only_path" {
		t.Errorf("removing in submit: %v", err)
	}
	if res := run(t, sb, "", "cat", "/workspace/src/a"); res.Stdout != "a" {
		t.Errorf("reading in submit: %+v", res)
	}
}
