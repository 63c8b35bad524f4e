package audit

import (
	"slices"
	"sync"
	"time"
)

// steps knows each sandbox's recent trajectory steps and when each began,
// to label an event with the step current at its time: events are
// handled later than they happened (the recorder may lag under load),
// and a step that began in between must not relabel them.
type steps struct {
	mu sync.Mutex // guards following fields
	by map[string][]stepStart
}

type stepStart struct {
	at   time.Time
	step int
}

// maxSteps bounds each sandbox's history: events are handled within
// seconds, and a step's command takes at least that.
const maxSteps = 16

// SetStep records that sandbox id's step began at at (the node's clock,
// which events' times are in). Steps only go forward: an older step is
// ignored.
func (r *Recorder) SetStep(id string, step int, at time.Time) {
	r.steps.mu.Lock()
	defer r.steps.mu.Unlock()
	if r.steps.by == nil {
		r.steps.by = map[string][]stepStart{}
	}
	h := r.steps.by[id]
	if n := len(h); n > 0 && (h[n-1].step > step || h[n-1].at.After(at)) {
		return
	}
	h = append(h, stepStart{at: at, step: step})
	if n := len(h) - maxSteps; n > 0 {
		h = slices.Delete(h, 0, n)
	}
	r.steps.by[id] = h
}

// ForgetSteps drops sandbox id's steps (it was destroyed).
func (r *Recorder) ForgetSteps(id string) {
	r.steps.mu.Lock()
	defer r.steps.mu.Unlock()
	delete(r.steps.by, id)
}

// stepAt is sandbox id's step at t: 0 before its first, the oldest kept
// for an event older than every step kept.
func (s *steps) stepAt(id string, t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.by[id]
	for i := len(h) - 1; i >= 0; i-- {
		if !t.Before(h[i].at) {
			return h[i].step
		}
	}
	if len(h) == maxSteps {
		return h[0].step
	}
	return 0
}
