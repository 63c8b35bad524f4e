package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/monitor"
)

// Subject is where sandbox id's audit events go (the audit stream,
// which the store makes).
func Subject(id string) string { return "dsec.audit." + id }

// Sink receives audit events.
type Sink interface {
	Append(ctx context.Context, e api.AuditEvent) error
}

// JetStreamSink publishes audit events to the audit stream without
// waiting for acknowledgements (the stream is a record; the monitor must
// not slow down).
type JetStreamSink struct{ JS jetstream.JetStream }

// Append implements Sink.
func (s JetStreamSink) Append(ctx context.Context, e api.AuditEvent) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	// An async publish on a closed connection leaves a goroutine of the
	// client library waiting forever (its status channel is nil then).
	if s.JS.Conn().IsClosed() {
		return nats.ErrConnectionClosed
	}
	_, err = s.JS.PublishAsync(Subject(e.Sandbox), b)
	return err
}

// events is what the recorder reads: a monitor's events.
type events interface {
	Watch(cgroupID uint64) error
	Unwatch(cgroupID uint64) error
	Events() <-chan monitor.Event
}

// Recorder turns a monitor's events into audit events: it knows which
// sandbox each watched cgroup2 group is, applies the rules and hands the
// result to a sink.
type Recorder struct {
	mon   events
	rules []Rule
	sink  Sink
	log   *slog.Logger
	done  chan struct{}

	mu      sync.Mutex // guards watched
	watched map[uint64]*watch

	steps steps // each sandbox's trajectory steps (steps.go)
}

type watch struct {
	sandbox string
	// phase names the sandbox's phase at an event's time: the event is
	// handled later than it happened (the recorder may lag under load),
	// and a phase change in between must not relabel it.
	phase func(at time.Time) string
}

// unwatchGrace is how long a group's events are still attributed after
// Unwatch: the kernel may have queued some just before.
const unwatchGrace = 5 * time.Second

// NewRecorder starts recording mon's events (if mon is not nil) to sink.
func NewRecorder(mon events, rules []Rule, sink Sink, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Recorder{mon: mon, rules: rules, sink: sink, log: log, done: make(chan struct{}), watched: map[uint64]*watch{}}
	if mon == nil {
		close(r.done)
		return r
	}
	go r.run()
	return r
}

// Record records an event sandbox id's tier observed itself (the
// function tier's file system calls), in phase.
func (r *Recorder) Record(id, phase string, e monitor.Event) {
	w := &watch{sandbox: id, phase: func(time.Time) string { return phase }}
	if err := r.sink.Append(context.Background(), r.event(w, e)); err != nil {
		r.log.Warn("recording an audit event", "sandbox", id, "err", err)
	}
}

// Watch attributes the tasks of cgroup2 group cgroupID to sandbox id;
// phase names its phase at an event's time (monitor.Event.Time, the
// kernel's clock).
func (r *Recorder) Watch(id string, cgroupID uint64, phase func(at time.Time) string) error {
	if r.mon == nil {
		return nil
	}
	r.mu.Lock()
	r.watched[cgroupID] = &watch{sandbox: id, phase: phase}
	r.mu.Unlock()
	if err := r.mon.Watch(cgroupID); err != nil {
		return fmt.Errorf("watching sandbox %s: %w", id, err)
	}
	return nil
}

// Unwatch stops watching the group.
func (r *Recorder) Unwatch(cgroupID uint64) {
	if r.mon == nil {
		return
	}
	if err := r.mon.Unwatch(cgroupID); err != nil {
		r.log.Warn("unwatching a cgroup", "id", cgroupID, "err", err)
	}
	r.mu.Lock()
	w := r.watched[cgroupID]
	r.mu.Unlock()
	time.AfterFunc(unwatchGrace, func() {
		r.mu.Lock()
		if r.watched[cgroupID] == w {
			delete(r.watched, cgroupID)
		}
		r.mu.Unlock()
	})
}

// Wait returns when the monitor's events end (it was closed).
func (r *Recorder) Wait() { <-r.done }

func (r *Recorder) run() {
	defer close(r.done)
	for e := range r.mon.Events() {
		r.mu.Lock()
		w := r.watched[e.Cgroup]
		r.mu.Unlock()
		if w == nil {
			continue
		}
		if err := r.sink.Append(context.Background(), r.event(w, e)); err != nil {
			r.log.Warn("recording an audit event", "sandbox", w.sandbox, "err", err)
		}
	}
}

// event is the audit event of e in w's sandbox.
func (r *Recorder) event(w *watch, e monitor.Event) api.AuditEvent {
	out := api.AuditEvent{
		Sandbox: w.sandbox, Time: e.Time.UTC(), Pid: e.Pid, UID: e.UID, Comm: e.Comm,
		Kind: e.Kind, Syscall: e.Syscall, Path: e.Path, Target: e.Target, Argv: e.Argv, Result: e.Ret, Detail: e.Detail,
		Verdict: "allowed", Severity: "info",
	}
	if w.phase != nil {
		out.Phase = w.phase(e.Time)
	}
	out.Step = r.steps.stepAt(w.sandbox, e.Time)
	if e.Addr.IsValid() {
		out.Addr = e.Addr.String()
	}
	switch {
	case e.Denied():
		out.Verdict = "denied"
	case e.Failed():
		out.Verdict = "failed"
	}
	for i := range r.rules {
		if r.rules[i].Matches(e) {
			out.Rule, out.Severity, out.Description = r.rules[i].Name, r.rules[i].Severity, r.rules[i].Description
			break
		}
	}
	return out
}
