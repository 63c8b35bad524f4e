package container

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// stepPure runs cmd as a tracked step of sb and says whether it was pure.
func stepPure(t testing.TB, sb *Sandbox, cmd string) (bool, string) {
	t.Helper()
	ctx := context.Background()
	m, err := sb.BeginStep(ctx)
	if err != nil {
		t.Fatalf("BeginStep before %q: %v", cmd, err)
	}
	if res := run(t, sb, "/bin/sh", "-c", cmd); res.ExitCode != 0 && !strings.Contains(cmd, "false") && !strings.Contains(cmd, "/no/such") {
		t.Logf("%q: %+v", cmd, res)
	}
	pure, why, err := sb.EndStep(ctx, m)
	if err != nil {
		t.Fatalf("EndStep after %q: %v", cmd, err)
	}
	return pure, why
}

// TestPureSteps checks that reads and failures are pure and every kind
// of change to the writable layer, or a process left running, is not.
func TestPureSteps(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	sb := createIn(t, rt, sandbox.Spec{ID: "steps", Image: world.image()}, nil)
	// Setup, itself not pure: a file to overwrite, a dir to list.
	if pure, _ := stepPure(t, sb, "echo hello > /tmp/f && mkdir -p /data && echo x > /data/a"); pure {
		t.Fatal("writing files was pure")
	}
	for _, tc := range []struct {
		cmd  string
		pure bool
		why  string
	}{
		{"ls -la / /tmp /data", true, ""},
		{"cat /tmp/f /etc/passwd", true, ""},
		{"false", true, ""},
		{"cat /no/such/file", true, ""},
		{"echo hello > /tmp/f", false, sandbox.WhyWrites}, // same content, same size
		{"printf j | dd of=/tmp/f bs=1 count=1 conv=notrunc 2>/dev/null", false, sandbox.WhyWrites}, // one byte, same size
		{"touch /tmp/f", false, sandbox.WhyWrites},
		{"mkdir /tmp/d", false, sandbox.WhyWrites},
		{"rm /bin/true", false, sandbox.WhyWrites}, // an image file: a whiteout
		{"chmod 600 /data/a", false, sandbox.WhyWrites},
		{"sleep 1000 > /dev/null 2>&1 &", false, sandbox.WhyProcesses},
		{"setsid sleep 1000 > /dev/null 2>&1 < /dev/null &", false, sandbox.WhyProcesses},
		{"ls /", true, ""}, // the sleeps still run: unchanged
		{"pkill sleep || killall sleep", false, sandbox.WhyProcesses},
	} {
		pure, why := stepPure(t, sb, tc.cmd)
		if pure != tc.pure || why != tc.why {
			t.Errorf("%q: pure=%v why=%q, want pure=%v why=%q", tc.cmd, pure, why, tc.pure, tc.why)
		}
	}
	// A change between two steps (the files API) counts against the
	// next one: a step begins where the last one ended.
	if _, err := sb.Files().Write(context.Background(), "/tmp/between", strings.NewReader("x"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if pure, why := stepPure(t, sb, "ls /"); pure || why != sandbox.WhyWrites {
		t.Errorf("the step after a write between steps: pure=%v why=%q, want not pure (writes)", pure, why)
	}
	if pure, _ := stepPure(t, sb, "ls /"); !pure {
		t.Error("the step after that is not pure")
	}
	// The node drops the mark after a files-API call of its own (a step
	// of its own): then the next command starts from a fresh mark.
	if _, err := sb.Files().Write(context.Background(), "/tmp/between", strings.NewReader("y"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	sb.DropMark()
	if pure, why := stepPure(t, sb, "ls /"); !pure {
		t.Errorf("the step after a write whose mark was dropped: pure=%v why=%q", pure, why)
	}
	// A tree the walk will not take (nested deeper than its bound) does
	// not stop commands: their steps are just not pure.
	// (Two chains of 1,500, one moved into the other: a path that deep
	// is too long for cd.)
	deep := `chain() { mkdir $1 && cd $1 && i=0; while [ $i -lt 1500 ]; do mkdir n && cd n || exit 1; i=$((i+1)); done; }
chain /deep2 && chain /deep && mv /deep2 .`
	if pure, _ := stepPure(t, sb, deep); pure {
		t.Error("nesting 3,000 directories was pure")
	}
	if pure, why := stepPure(t, sb, "ls /"); pure || why != sandbox.WhyUnknown {
		t.Errorf("a step over a too deep tree: pure=%v why=%q, want not pure (unknown)", pure, why)
	}
}

// TestStepUnknownAfterRestart checks that a sandbox adopted by a new
// runtime (the node restarted), whose upper is out of reach, never calls
// a step pure.
func TestStepUnknownAfterRestart(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	ctx := context.Background()
	sb := createIn(t, rt, sandbox.Spec{ID: "adopted", Image: world.image()}, nil)
	sb.closeUpper() // what a restart loses
	m, err := sb.BeginStep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Unknown == "" {
		t.Fatal("a mark without the upper is not marked unknown")
	}
	run(t, sb, "true")
	if pure, why, err := sb.EndStep(ctx, m); err != nil || pure || why != sandbox.WhyUnknown {
		t.Fatalf("EndStep without the upper: pure=%v why=%q err=%v, want not pure, unknown", pure, why, err)
	}
}

// BenchmarkStepMark measures BeginStep+EndStep (what a tracked exec adds)
// on a fresh sandbox and on one with 5,000 files in its upper.
func BenchmarkStepMark(b *testing.B) {
	world.get(b)
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	rt := newRuntime(b, dir, runtimeOptions{})
	for _, files := range []int{0, 5000} {
		b.Run(map[int]string{0: "fresh", 5000: "files=5000"}[files], func(b *testing.B) {
			sb := createIn(b, rt, sandbox.Spec{ID: "bench" + map[int]string{0: "0", 5000: "5k"}[files], Image: world.image()}, nil)
			if files > 0 {
				res := run(b, sb, "/bin/sh", "-c", "mkdir -p /w && cd /w && for d in $(seq 50); do mkdir $d; for f in $(seq 100); do echo $f > $d/$f; done; done")
				if res.ExitCode != 0 {
					b.Fatalf("making files: %+v", res)
				}
			}
			ctx := context.Background()
			b.ResetTimer()
			for b.Loop() {
				m, err := sb.BeginStep(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if pure, why, err := sb.EndStep(ctx, m); err != nil || !pure {
					b.Fatalf("idle sandbox: pure=%v why=%q err=%v", pure, why, err)
				}
			}
		})
	}
}

// TestAuditStepTags checks that the audit events of a command run at a
// trajectory step carry that step, and those of the next step the next:
// the label is the step current at the event's time, whenever the
// recorder handles it.
func TestAuditStepTags(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rec, log := startAudit(t)
	rt := newRuntime(t, dir, runtimeOptions{monitor: rec})
	sb := createIn(t, rt, sandbox.Spec{ID: "auditsteps", Image: world.image()}, nil)
	e := &isoEnv{audit: log}
	for _, step := range []int{7, 8} {
		rec.SetStep(sb.id, step, time.Now())
		marker := fmt.Sprintf("/no-such-step-marker-%d", step)
		run(t, sb, "/bin/ls", marker)
		ok := func(ev api.AuditEvent) bool { return ev.Kind == "exec" && slices.Contains(ev.Argv, marker) }
		if !waitEvent(e, sb, 10*time.Second, ok) {
			t.Fatalf("no exec event of step %d's command", step)
		}
		if !e.hasEvent(sb, func(ev api.AuditEvent) bool { return ok(ev) && ev.Step == step }) {
			t.Errorf("the exec event of step %d's command is not tagged with it", step)
		}
		if e.hasEvent(sb, func(ev api.AuditEvent) bool { return ok(ev) && ev.Step != step }) {
			t.Errorf("an exec event of step %d's command has another step", step)
		}
	}
	rec.ForgetSteps(sb.id)
	run(t, sb, "/bin/ls", "/no-such-step-marker-none")
	ok := func(ev api.AuditEvent) bool {
		return ev.Kind == "exec" && slices.Contains(ev.Argv, "/no-such-step-marker-none")
	}
	if !waitEvent(e, sb, 10*time.Second, ok) {
		t.Fatal("no exec event of the command without a step")
	}
	if e.hasEvent(sb, func(ev api.AuditEvent) bool { return ok(ev) && ev.Step != 0 }) {
		t.Error("an event after the steps were forgotten has a step")
	}
}
