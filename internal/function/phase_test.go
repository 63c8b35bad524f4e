package function

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/audit"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// TestPhases: the phase decides which workspace paths modules and the
// files API may write; results name the phase; a change ends the calls
// of the earlier phase.
func TestPhases(t *testing.T) {
	rt, sink := auditedRuntime(t)
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
		if n := sink.count(sb.ID(), "phase-survivor"); n != 1 {
			t.Errorf("%d phase-survivor events for the call the change ended, want 1", n)
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

// collect is an audit sink for tests.
type collect struct {
	mu  sync.Mutex
	evs []api.AuditEvent
}

func (c *collect) Append(_ context.Context, e api.AuditEvent) error {
	c.mu.Lock()
	c.evs = append(c.evs, e)
	c.mu.Unlock()
	return nil
}

// auditedRuntime is a runtime whose audit events, judged by the default
// rules, go to the returned sink.
func auditedRuntime(t *testing.T) (*Runtime, *collect) {
	t.Helper()
	rules, err := audit.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	sink := &collect{}
	return newRuntime(t, t.TempDir(), Options{Audit: audit.NewRecorder(nil, rules, sink, nil)}), sink
}

// count counts sandbox id's events of rule.
func (c *collect) count(id, rule string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.evs {
		if e.Sandbox == id && e.Rule == rule {
			n++
		}
	}
	return n
}

// TestAudit: a module's writes to the workspace are audit events with
// their verdict and rule; reads are not.
func TestAudit(t *testing.T) {
	rt, sink := auditedRuntime(t)
	sb := create(t, rt, func(s *sandbox.Spec) {
		s.Phases = []api.Phase{{Name: "coding", Writable: []string{"/workspace/src", "/workspace/tests"}}}
	})
	ctx := context.Background()
	for _, d := range []string{"/workspace/src", "/workspace/tests"} {
		if _, err := sb.Files().Mkdir(ctx, d, false); err != nil {
			t.Fatal(err)
		}
	}
	run(t, sb, "a", "write", "/workspace/src/a")
	run(t, sb, "b", "write", "/workspace/b")
	run(t, sb, "def test(): pass", "write", "/workspace/tests/test_x.py")
	run(t, sb, "", "cat", "/workspace/src/a")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	got := map[string]api.AuditEvent{}
	for _, e := range sink.evs {
		got[e.Path] = e
		if e.Sandbox != sb.ID() || e.Phase != "coding" || e.Syscall != "openat" {
			t.Errorf("event %+v", e)
		}
	}
	if e := got["/workspace/src/a"]; e.Verdict != "allowed" || e.Rule != "" {
		t.Errorf("a write under a writable path: %+v", e)
	}
	if e := got["/workspace/b"]; e.Verdict != "denied" || e.Result != -30 {
		t.Errorf("a write the phase refuses: %+v", e)
	}
	if e := got["/workspace/tests/test_x.py"]; e.Verdict != "allowed" || e.Rule != "test-tampering" || e.Severity != "high" {
		t.Errorf("a test file written: %+v", e)
	}
	if len(sink.evs) != 3 {
		t.Errorf("%d events, want the 3 writes (reads are not events)", len(sink.evs))
	}
}

// TestPhaseExecutables: a phase with executables runs only the modules
// it names (a tool by its /bin/<name>.wasm path, or a directory's); any
// other is refused (executable_not_allowed) and audited; the same call
// runs in a phase without them. Capabilities are refused.
func TestPhaseExecutables(t *testing.T) {
	rt, sink := auditedRuntime(t)
	phases := []api.Phase{
		{Name: "open"},
		{Name: "locked", Executables: []string{"/bin/cat.wasm"}},
		{Name: "dir", Executables: []string{"/bin/*"}},
	}
	sb := create(t, rt, func(s *sandbox.Spec) { s.Phases = phases })
	ctx := context.Background()
	if res := run(t, sb, "", "write", "/workspace/a"); res.ExitCode != 0 {
		t.Fatalf("negative control, no executables: %+v", res)
	}
	if err := sb.SetPhase(ctx, phases[1]); err != nil {
		t.Fatal(err)
	}
	if res := run(t, sb, "", "cat", "/workspace/a"); res.ExitCode != 0 {
		t.Errorf("an allowed tool: %+v", res)
	}
	_, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"write", "/workspace/b"}}})
	if errdefs.CodeOf(err) != "executable_not_allowed" {
		t.Errorf("a tool the phase does not name: %v", err)
	}
	sink.mu.Lock()
	var found bool
	for _, e := range sink.evs {
		found = found || e.Kind == "exec" && e.Path == "/bin/write.wasm" && e.Rule == "exec-not-allowed" && e.Verdict == "denied" && e.Phase == "locked"
	}
	sink.mu.Unlock()
	if !found {
		t.Error("no exec-not-allowed audit event")
	}
	if err := sb.SetPhase(ctx, phases[2]); err != nil {
		t.Fatal(err)
	}
	if res := run(t, sb, "", "write", "/workspace/b"); res.ExitCode != 0 {
		t.Errorf("a tool of an allowed directory: %+v", res)
	}
	if err := sb.SetPhase(ctx, api.Phase{Name: "caps", Capabilities: []string{"CAP_CHOWN"}}); errdefs.CodeOf(err) != "tier_has_no_capabilities" {
		t.Errorf("a phase with capabilities: %v", err)
	}
}

// TestPhaseLinkOutOfReadOnly: a hard link gives a second name to the
// same file, so a module that could link a file of a read-only path to a
// writable one could write the read-only file through it. The link is
// refused unless both names are writable; a link within the writable
// paths still works (the control).
func TestPhaseLinkOutOfReadOnly(t *testing.T) {
	rt, sink := auditedRuntime(t)
	ctx := context.Background()
	phases := []api.Phase{{Name: "setup"}, {Name: "coding", Writable: []string{"/workspace/out"}}}
	sb := create(t, rt, func(s *sandbox.Spec) { s.Phases = phases })
	for _, p := range []string{"/workspace/ro/data", "/workspace/out/mine"} {
		if _, err := sb.Files().Write(ctx, p, strings.NewReader("pristine"), sandbox.WriteOptions{Parents: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.SetPhase(ctx, phases[1]); err != nil {
		t.Fatal(err)
	}
	fs := sb.workFS
	if e := fs.Link("ro/data", "out/x"); e != experimentalsys.EROFS {
		t.Errorf("linking a read-only file into a writable path: errno %v, want EROFS", e)
	}
	if n := sink.count(sb.ID(), "read-only-write"); n != 1 {
		t.Errorf("%d read-only-write events for the refused link, want 1", n)
	}
	if f, e := fs.OpenFile("out/x", experimentalsys.O_WRONLY|experimentalsys.O_TRUNC, 0); e == 0 {
		_, _ = f.Write([]byte("hacked"))
		f.Close()
	}
	if res := run(t, sb, "", "cat", "/workspace/ro/data"); res.Stdout != "pristine" {
		t.Errorf("the read-only file after a link and a write: %q", res.Stdout)
	}
	if e := fs.Link("out/mine", "out/mine2"); e != 0 {
		t.Errorf("a link within the writable path: errno %v", e)
	}
}
