package function

// The catalogue's attacks on the function tier (A47–A49): each asserts
// the safe outcome and a control where the same module, given room or a
// legitimate path, does what the attack wanted. Each is audited: the
// tier records its workspace's writes, a growth its memory limit refused
// (memory-limit) and a call its deadline stopped (call-timeout).

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

func TestAdversarial(t *testing.T) {
	rt, sink := auditedRuntime(t)
	ctx := context.Background()

	t.Run("A47_memory_grow", func(t *testing.T) {
		sb := create(t, rt, func(s *sandbox.Spec) { s.MemoryMB = 64 })
		if res := run(t, sb, "", "alloc", "512"); res.ExitCode == 0 || !strings.Contains(res.Stderr, "out of memory") {
			t.Errorf("512 MiB under 64 MiB: %+v", res)
		}
		if n := sink.count(sb.ID(), "memory-limit"); n != 1 {
			t.Errorf("%d memory-limit events for the refused growth, want 1", n)
		}
		// Control: within the limit the same module allocates, unseen.
		if res := run(t, sb, "", "alloc", "16"); res.ExitCode != 0 {
			t.Errorf("control: 16 MiB under 64 MiB: %+v", res)
		}
		if n := sink.count(sb.ID(), "memory-limit"); n != 1 {
			t.Errorf("%d memory-limit events after the control, want still 1", n)
		}
	})

	t.Run("A48_busy_loop", func(t *testing.T) {
		sb := create(t, rt, nil)
		start := time.Now()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"loop"}, TimeoutS: 0.2}})
		if err != nil || !res.TimedOut || time.Since(start) > 5*time.Second {
			t.Errorf("loop under a 0.2 s deadline: %+v, %v after %v", res, err, time.Since(start))
		}
		// Control: the sandbox still answers, and a call that ends in
		// time is not cut.
		if res := run(t, sb, "", "echo", "ok"); res.Stdout != "ok\n" || res.TimedOut {
			t.Errorf("control: %+v", res)
		}
		if n := sink.count(sb.ID(), "call-timeout"); n != 1 {
			t.Errorf("%d call-timeout events, want 1 (the loop's)", n)
		}
	})

	t.Run("A49_path_escape", func(t *testing.T) {
		sb := create(t, rt, func(s *sandbox.Spec) {
			s.Phases = []api.Phase{{Name: "coding", Writable: []string{"/workspace/src", "/workspace/openat.wasm"}}}
		})
		if _, err := sb.Files().Mkdir(ctx, "/workspace/src", false); err != nil {
			t.Fatal(err)
		}
		openat := installTool(t, sb, "openat")
		for _, argv := range [][]string{
			{openat, "4", "../../etc/passwd"}, {openat, "3", "../../etc/passwd"}, {"cat", "/workspace/../../etc/passwd"},
		} {
			if res := run(t, sb, "", argv...); res.ExitCode == 0 || strings.Contains(res.Stdout, "root:") {
				t.Errorf("%q escaped: %+v", argv, res)
			}
		}
		// A write out of the phase's writable path, by .. : refused and
		// audited; the control, a write inside, is allowed with no rule.
		run(t, sb, "x", "write", "/workspace/src/../tests/test_x.py")
		run(t, sb, "x", "write", "/workspace/src/ok.py")
		sink.mu.Lock()
		defer sink.mu.Unlock()
		var escaped, inside bool
		for _, e := range sink.evs {
			if e.Sandbox != sb.ID() {
				continue
			}
			escaped = escaped || strings.HasSuffix(e.Path, "tests/test_x.py") && e.Verdict == "denied" && e.Rule == "test-tampering"
			inside = inside || e.Path == "/workspace/src/ok.py" && e.Verdict == "allowed" && e.Rule == ""
		}
		if !escaped || !inside {
			t.Errorf("audit events: the escaping write %v, the control %v: %+v", escaped, inside, sink.evs)
		}
	})
}
