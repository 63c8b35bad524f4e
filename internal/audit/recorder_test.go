package audit

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/monitor"
)

type memSink struct {
	mu     sync.Mutex
	events []api.AuditEvent
}

func (s *memSink) Append(_ context.Context, e api.AuditEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	return nil
}

// TestRecordSandboxEnded: the node's report of a sandbox that ended by
// itself becomes a failed, high-severity audit event carrying the
// reason.
func TestRecordSandboxEnded(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	r := NewRecorder(nil, rules, sink, nil)
	r.Record("sb-1", "coding", monitor.Event{Kind: monitor.KindSandboxEnded, Pid: 42, Comm: "dsec-guest", Ret: 9,
		Detail: "agent_exited: killed by SIGKILL"})
	if len(sink.events) != 1 {
		t.Fatalf("events: %+v", sink.events)
	}
	e := sink.events[0]
	if e.Sandbox != "sb-1" || e.Phase != "coding" || e.Kind != "sandbox-ended" || e.Rule != "sandbox-ended" ||
		e.Severity != "high" || e.Verdict != "failed" || e.Detail != "agent_exited: killed by SIGKILL" || e.Pid != 42 || e.Result != 9 {
		t.Errorf("event %+v", e)
	}
}

// TestStepLabels: an event gets the step current at its time, however
// late it is handled; a sandbox without steps, or whose steps were
// forgotten, gets none; steps do not go back.
func TestStepLabels(t *testing.T) {
	sink := &memSink{}
	r := NewRecorder(nil, nil, sink, nil)
	t0 := time.Now()
	r.SetStep("sb", 7, t0)
	r.SetStep("sb", 8, t0.Add(time.Second))
	r.SetStep("sb", 3, t0.Add(2*time.Second)) // out of order: ignored
	for _, at := range []time.Duration{-time.Second, 0, 500 * time.Millisecond, time.Second, 3 * time.Second} {
		r.Record("sb", "", monitor.Event{Kind: monitor.KindFileAPI, Time: t0.Add(at)})
	}
	r.Record("other", "", monitor.Event{Kind: monitor.KindFileAPI, Time: t0.Add(time.Second)})
	r.ForgetSteps("sb")
	r.Record("sb", "", monitor.Event{Kind: monitor.KindFileAPI, Time: t0.Add(time.Second)})
	var got []int
	for _, e := range sink.events {
		got = append(got, e.Step)
	}
	if want := []int{0, 7, 7, 8, 8, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
}
