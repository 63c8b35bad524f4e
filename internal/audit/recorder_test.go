package audit

import (
	"context"
	"sync"
	"testing"

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
