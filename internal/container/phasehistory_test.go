package container

import (
	"testing"
	"time"
)

// TestPhaseHistory: an event is labelled with the phase it happened in,
// however late it is handled.
func TestPhaseHistory(t *testing.T) {
	var h phaseHistory
	if _, ok := h.at(time.Now()); ok {
		t.Fatal("an empty history named a phase")
	}
	t0 := time.Now()
	h.begin("setup", "flat", t0)
	h.begin("flat", "tree", t0.Add(time.Second))
	for _, c := range []struct {
		at   time.Time
		want string
	}{
		{t0.Add(-time.Hour), "setup"},
		{t0.Add(-time.Nanosecond), "setup"},
		{t0, "flat"},
		{t0.Add(999 * time.Millisecond), "flat"},
		{t0.Add(time.Second), "tree"},
		{t0.Add(time.Hour), "tree"},
	} {
		if got, ok := h.at(c.at); !ok || got != c.want {
			t.Errorf("at %v: %q, %v; want %q", c.at.Sub(t0), got, ok, c.want)
		}
	}
	// Bounded: the oldest changes go; an event older than all kept gets
	// the oldest kept.
	for i := range 2 * maxPhaseChanges {
		h.begin("x", string(rune('a'+i)), t0.Add(time.Duration(2+i)*time.Second))
	}
	if len(h.changes) != maxPhaseChanges {
		t.Errorf("%d changes kept, want %d", len(h.changes), maxPhaseChanges)
	}
	oldest := h.changes[0].name
	if got, _ := h.at(t0); got != oldest {
		t.Errorf("an event before the kept history: %q, want the oldest kept %q", got, oldest)
	}
}
