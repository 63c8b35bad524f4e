package trajectory

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestAppendAndPages: steps come back in order, page by page, from any
// step, with other trajectories' steps interleaved in the stream.
func TestAppendAndPages(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "run-1/a", "o")
	begin(t, s, "run-1/b", "o")
	const n = 57
	for i := 1; i <= n; i++ {
		appendN(t, s, "run-1/a", i, i)
		appendN(t, s, "run-1/b", 2*i-1, 2*i) // b has twice as many, between a's
	}
	var got []int
	for after, pages := 0, 0; ; pages++ {
		if pages > n {
			t.Fatalf("more pages than steps; read so far: %v", got)
		}
		page, err := s.Steps(ctx, "run-1/a", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 10 {
			t.Fatalf("page of %d steps, limit 10", len(page))
		}
		for _, st := range page {
			if st.Trajectory != "run-1/a" || st.Exec == nil || st.Labels["writer"] != "w" {
				t.Fatalf("step %+v is not one of run-1/a's", st)
			}
		}
		got = append(got, stepNumbers(page)...)
		after = page[len(page)-1].Step
	}
	if !slices.Equal(got, seq(1, n)) {
		t.Fatalf("paged steps = %v, want 1..%d", got, n)
	}
	// Any start: the page begins right after it.
	for _, after := range []int{0, 1, 2, 13, 28, 29, 55, 56} {
		page, err := s.Steps(ctx, "run-1/a", after, 3)
		if err != nil {
			t.Fatal(err)
		}
		want := seq(after+1, min(after+3, n))
		if !slices.Equal(stepNumbers(page), want) {
			t.Errorf("Steps(after %d) = %v, want %v", after, stepNumbers(page), want)
		}
	}
	for _, after := range []int{n, n + 5} {
		if page, err := s.Steps(ctx, "run-1/a", after, 3); err != nil || len(page) != 0 {
			t.Errorf("Steps(after %d) = %v, %v; want none", after, stepNumbers(page), err)
		}
	}
	last, ok, err := s.Last(ctx, "run-1/b")
	if err != nil || !ok || last.Step != 2*n {
		t.Fatalf("Last(b) = %d, %v, %v; want %d", last.Step, ok, err, 2*n)
	}
	h, _, err := s.Head(ctx, "run-1/a")
	if err != nil || h.Steps != n || h.Bytes == 0 || h.Owner != "o" || h.State != api.TrajectoryRecording {
		t.Fatalf("Head = %+v, %v", h, err)
	}
}

// TestAppendRefusals: a step must follow the last, belong to the
// trajectory and have a head; reads of an unknown trajectory are
// NotFound.
func TestAppendRefusals(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "r", "o")
	appendN(t, s, "r", 1, 3)
	other := execStep(2, "someone-else")
	if err := s.Append(ctx, "r", other); !errors.Is(err, errdefs.Conflict) || errdefs.CodeOf(err) != api.CodeTrajectoryChanged {
		t.Errorf("a different step 2: err = %v, want Conflict %s", err, api.CodeTrajectoryChanged)
	}
	if err := s.Append(ctx, "r", execStep(0, "w")); err == nil {
		t.Error("step 0 was accepted")
	}
	wrong := execStep(4, "w")
	wrong.Trajectory = "elsewhere"
	if err := s.Append(ctx, "r", wrong); err == nil {
		t.Error("a step of another trajectory was accepted")
	}
	if err := s.Append(ctx, "never-begun", execStep(1, "w")); !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != api.CodeTrajectoryNotFound {
		t.Errorf("append without a head: err = %v, want NotFound", err)
	}
	if _, err := s.Steps(ctx, "never-begun", 0, 10); errdefs.CodeOf(err) != api.CodeTrajectoryNotFound {
		t.Errorf("Steps without a head: err = %v", err)
	}
	if _, err := s.Steps(ctx, "bad id", 0, 10); errdefs.CodeOf(err) != api.CodeInvalidTrajectoryID {
		t.Errorf("Steps of an invalid ID: err = %v", err)
	}
	// Negative control: the refusals wrote nothing; the next step goes.
	appendN(t, s, "r", 4, 4)
	if got := subjectMsgs(t, s, "r"); got != 4 {
		t.Fatalf("the log holds %d messages, want 4", got)
	}
}

// TestRacingWriters: writers on two Stores (separate memories, as two
// servers) and two goroutines each append the same step numbers to one
// trajectory. Each number is won by exactly one writer, whose step is
// the one logged, and the log is 1..n with no duplicates.
func TestRacingWriters(t *testing.T) {
	js, _ := newJS(t)
	stores := []*Store{openStore(t, js, Options{}), openStore(t, js, Options{})}
	ctx := ctxT(t)
	begin(t, stores[0], "race", "o")
	const n = 40
	var mu sync.Mutex
	won := map[int][]string{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, who := stores[w%2], fmt.Sprintf("writer-%d", w)
			for i := 1; i <= n; i++ {
				err := s.Append(ctx, "race", execStep(i, who))
				switch {
				case err == nil:
					mu.Lock()
					won[i] = append(won[i], who)
					mu.Unlock()
				case errdefs.CodeOf(err) != api.CodeTrajectoryChanged:
					t.Errorf("%s step %d: %v", who, i, err)
					return
				}
			}
		}()
	}
	testenv.WaitGroup(t, &wg, time.Minute, "the racing writers")
	steps, err := stores[0].Steps(ctx, "race", 0, MaxPage)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stepNumbers(steps), seq(1, n)) {
		t.Fatalf("the log holds steps %v, want 1..%d once each", stepNumbers(steps), n)
	}
	for _, st := range steps {
		if w := won[st.Step]; len(w) != 1 || w[0] != st.Labels["writer"] {
			t.Errorf("step %d: logged by %s, acknowledged to %v", st.Step, st.Labels["writer"], w)
		}
	}
	if got := subjectMsgs(t, stores[0], "race"); got != n {
		t.Errorf("the subject holds %d messages, want %d", got, n)
	}
}

// TestIdempotentRetry: appending a step again (its acknowledgement lost)
// succeeds without a second copy, from the Store that wrote it, from one
// that did not see it written, and from one whose view is a step behind
// (its publish fails on the expected sequence, and the logged step is
// found equal). A different step of that number is a Conflict.
func TestIdempotentRetry(t *testing.T) {
	js, _ := newJS(t)
	a, b := openStore(t, js, Options{}), openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, a, "retry", "o")
	st1 := execStep(1, "w")
	if err := b.Append(ctx, "retry", st1); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, "retry", st1); err != nil {
		t.Fatalf("the same step again, same Store: %v", err)
	}
	if err := a.Append(ctx, "retry", execStep(1, "w")); err != nil {
		t.Fatalf("the same step again, another Store: %v", err)
	}
	// b knows step 1 only; a writes step 2, as b's own publish would
	// have before its acknowledgement was lost.
	st2 := execStep(2, "w")
	if err := a.Append(ctx, "retry", st2); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, "retry", execStep(2, "w")); err != nil {
		t.Fatalf("a retry whose first try's ack was lost: %v", err)
	}
	if err := b.Append(ctx, "retry", execStep(2, "other")); errdefs.CodeOf(err) != api.CodeTrajectoryChanged {
		t.Errorf("a different step 2: err = %v, want %s", err, api.CodeTrajectoryChanged)
	}
	if err := b.Append(ctx, "retry", execStep(1, "other")); errdefs.CodeOf(err) != api.CodeTrajectoryChanged {
		t.Errorf("a different step 1 (not the last): err = %v, want %s", err, api.CodeTrajectoryChanged)
	}
	if got := subjectMsgs(t, a, "retry"); got != 2 {
		t.Fatalf("the log holds %d messages, want 2", got)
	}
	// b's view is current again: its next step goes.
	if err := b.Append(ctx, "retry", execStep(3, "w")); err != nil {
		t.Fatal(err)
	}
}

// TestSizeCap: a step that would take the trajectory past MaxBytes is
// refused and not logged; one that reaches it exactly is logged.
func TestSizeCap(t *testing.T) {
	js, _ := newJS(t)
	size := func(st *api.TrajectoryStep) int64 {
		c := *st
		c.Trajectory = "cap"
		b, _ := json.Marshal(&c)
		return int64(len(b))
	}
	max := size(execStep(1, "w")) + size(execStep(2, "w"))
	s := openStore(t, js, Options{MaxBytes: max})
	ctx := ctxT(t)
	begin(t, s, "cap", "o")
	if err := s.Room(ctx, "cap"); err != nil {
		t.Fatalf("Room of an empty trajectory: %v", err)
	}
	appendN(t, s, "cap", 1, 2) // exactly max: allowed
	if err := s.Room(ctx, "cap"); errdefs.CodeOf(err) != api.CodeTrajectoryFull || !errors.Is(err, errdefs.TooLarge) {
		t.Errorf("Room at the cap: err = %v, want TooLarge %s", err, api.CodeTrajectoryFull)
	}
	if err := s.Append(ctx, "cap", execStep(3, "w")); errdefs.CodeOf(err) != api.CodeTrajectoryFull {
		t.Errorf("a step past the cap: err = %v, want %s", err, api.CodeTrajectoryFull)
	}
	if _, _, err := s.PutBlob(ctx, "cap", bytes.NewReader([]byte("x"))); errdefs.CodeOf(err) != api.CodeTrajectoryFull {
		t.Errorf("a blob past the cap: err = %v, want %s", err, api.CodeTrajectoryFull)
	}
	if got := subjectMsgs(t, s, "cap"); got != 2 {
		t.Errorf("the log holds %d messages, want 2", got)
	}

	// One byte less, and the second step is over.
	s2 := openStore(t, js, Options{MaxBytes: max - 1})
	begin(t, s2, "cap2", "o")
	s2.Append(ctx, "cap2", execStep(1, "w"))
	c := execStep(2, "w")
	if err := s2.Append(ctx, "cap2", c); errdefs.CodeOf(err) != api.CodeTrajectoryFull {
		t.Errorf("a step one byte past the cap: err = %v", err)
	}
}

// TestExport: every step, one JSON object a line, in order.
func TestExport(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "exp", "o")
	begin(t, s, "noise", "o")
	const n = 600 // more than one fetch batch
	for i := 1; i <= n; i++ {
		appendN(t, s, "exp", i, i)
		if i%3 == 0 {
			appendN(t, s, "noise", i/3, i/3)
		}
	}
	var buf bytes.Buffer
	if err := s.Export(ctx, "exp", &buf); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	next := 1
	for sc.Scan() {
		var st api.TrajectoryStep
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&st); err != nil {
			t.Fatalf("line %d is not a step: %v", next, err)
		}
		if st.Step != next || st.Trajectory != "exp" {
			t.Fatalf("line %d holds step %d of %s", next, st.Step, st.Trajectory)
		}
		next++
	}
	if next != n+1 {
		t.Fatalf("export has %d lines, want %d", next-1, n)
	}
	var empty bytes.Buffer
	begin(t, s, "empty", "o")
	if err := s.Export(ctx, "empty", &empty); err != nil || empty.Len() != 0 {
		t.Fatalf("export of an empty log: %q, %v", empty.String(), err)
	}
}

// TestHeadCAS: a head is created once, updated by compare-and-set, and
// its counters are flushed for other processes to see.
func TestHeadCAS(t *testing.T) {
	js, _ := newJS(t)
	s, other := openStore(t, js, Options{}), openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "h", "o")
	if err := s.Begin(ctx, Head{Trajectory: api.Trajectory{ID: "h"}}); errdefs.CodeOf(err) != api.CodeTrajectoryExists {
		t.Errorf("Begin twice: err = %v, want %s", err, api.CodeTrajectoryExists)
	}
	if _, _, err := s.Head(ctx, "nope"); errdefs.CodeOf(err) != api.CodeTrajectoryNotFound {
		t.Errorf("Head of a missing one: err = %v", err)
	}
	h, rev, err := s.Head(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	h.State = api.TrajectoryEnded
	if _, err := s.UpdateHead(ctx, h, rev); err != nil {
		t.Fatal(err)
	}
	h.State = api.TrajectoryDiverged
	if _, err := s.UpdateHead(ctx, h, rev); errdefs.CodeOf(err) != api.CodeTrajectoryChanged || !errors.Is(err, errdefs.Conflict) {
		t.Errorf("a stale update: err = %v, want Conflict %s", err, api.CodeTrajectoryChanged)
	}
	if h, err := other.MutateHead(ctx, "h", func(h *Head) error { h.Incarnations++; return nil }); err != nil || h.Incarnations != 2 || h.State != api.TrajectoryEnded {
		t.Errorf("MutateHead = %+v, %v", h, err)
	}

	// Counters: the writer sees them at once, another Store after the
	// lazy flush (bounded wait).
	appendN(t, s, "h", 1, 5)
	if h, _, _ := s.Head(ctx, "h"); h.Steps != 5 {
		t.Errorf("the writer's Head shows %d steps, want 5", h.Steps)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		h, _, err := other.Head(ctx, "h")
		if err != nil {
			t.Fatal(err)
		}
		if h.Steps == 5 && h.Bytes > 0 && h.Incarnations == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("another Store's Head shows %+v, not 5 steps, long after the flush was due", h)
		}
	}
}
