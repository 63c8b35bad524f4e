package trajectory

import (
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestBeginReusedName: a name whose earlier trajectory's head is gone
// but whose steps are not (a retention changed between) starts a log of
// its own: the first append finds the old steps and purges them.
func TestBeginReusedName(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "reused", "o")
	appendN(t, s, "reused", 1, 3)
	if err := s.heads.Purge(ctx, headKey("reused")); err != nil {
		t.Fatal(err)
	}
	s.forget("reused")
	begin(t, s, "reused", "o")
	st := execStep(1, "new")
	if err := s.Append(ctx, "reused", st); err != nil {
		t.Fatalf("the first append after the name's reuse: %v", err)
	}
	steps, err := s.Steps(ctx, "reused", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].Sandbox != "sb-new" {
		t.Errorf("the log after the reuse holds %v", stepNumbers(steps))
	}
}

// TestBeginTakenNameLeavesNoIndex: a Begin that loses a name to another
// owner leaves no index entry for its owner (it writes one with the
// head, at once).
func TestBeginTakenNameLeavesNoIndex(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "taken", "alice")
	err := s.Begin(ctx, Head{Trajectory: api.Trajectory{ID: "taken"}, Owner: "bob"})
	if errdefs.CodeOf(err) != api.CodeTrajectoryExists {
		t.Fatalf("bob's Begin: %v", err)
	}
	if _, err := s.heads.Get(ctx, ownerKey("bob", "taken")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("bob's index entry for alice's trajectory: %v", err)
	}
	if _, err := s.heads.Get(ctx, ownerKey("alice", "taken")); err != nil {
		t.Errorf("alice's index entry: %v", err)
	}
	// Alice beginning her own name again keeps her entry.
	if err := s.Begin(ctx, Head{Trajectory: api.Trajectory{ID: "taken"}, Owner: "alice"}); errdefs.CodeOf(err) != api.CodeTrajectoryExists {
		t.Fatalf("alice's second Begin: %v", err)
	}
	if page, _, err := s.List(ctx, "alice", "", 10); err != nil || !slices.Equal(headIDs(page), []string{"taken"}) {
		t.Errorf("alice's list = %v, %v", headIDs(page), err)
	}
}

// TestFinish: the last step and the head are written together, with the
// counters of the log that holds the step; a head changed since it was
// read is written again after the step; a function that leaves the head
// still has the step appended.
func TestFinish(t *testing.T) {
	js, _ := newJS(t)
	s, other := openStore(t, js, Options{}), openStore(t, js, Options{})
	ctx := ctxT(t)
	end := func(h *Head) error { h.State = api.TrajectoryEnded; return nil }
	endStep := func(n int) *api.TrajectoryStep {
		return &api.TrajectoryStep{Step: n, Kind: api.KindEnd, End: &api.StepEnd{Reason: "deleted"}}
	}

	begin(t, s, "f", "o")
	appendN(t, s, "f", 1, 2)
	h, rev, err := s.Head(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "f", endStep(3), h, rev, end); err != nil {
		t.Fatal(err)
	}
	got, _, err := other.Head(ctx, "f") // another Store: what is written
	if err != nil {
		t.Fatal(err)
	}
	steps, err := s.Steps(ctx, "f", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, st := range steps {
		b, _ := encodeStep("f", &st)
		bytes += int64(len(b))
	}
	if got.State != api.TrajectoryEnded || got.Steps != 3 || !slices.Equal(stepNumbers(steps), []int{1, 2, 3}) || got.Bytes != bytes {
		t.Errorf("after Finish: head %s, %d steps, %d bytes; log %v, %d bytes", got.State, got.Steps, got.Bytes, stepNumbers(steps), bytes)
	}

	// A head changed since it was read.
	begin(t, s, "g", "o")
	appendN(t, s, "g", 1, 1)
	h, rev, _ = s.Head(ctx, "g")
	if _, err := other.MutateHead(ctx, "g", func(h *Head) error { h.Incarnations = 7; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "g", endStep(2), h, rev, end); err != nil {
		t.Fatalf("Finish over a changed head: %v", err)
	}
	if got, _, _ := other.Head(ctx, "g"); got.State != api.TrajectoryEnded || got.Incarnations != 7 || got.Steps != 2 {
		t.Errorf("after Finish over a changed head: %+v", got)
	}

	// A function that leaves the head.
	begin(t, s, "k", "o")
	leave := errors.New("leave it")
	h, rev, _ = s.Head(ctx, "k")
	if err := s.Finish(ctx, "k", endStep(1), h, rev, func(*Head) error { return leave }); !errors.Is(err, leave) {
		t.Errorf("Finish whose function leaves the head: %v", err)
	}
	if got, _, _ := other.Head(ctx, "k"); got.State != api.TrajectoryRecording {
		t.Errorf("the head left is %s", got.State)
	}
	if last, ok, err := s.Last(ctx, "k"); err != nil || !ok || last.Kind != api.KindEnd {
		t.Errorf("the step of a Finish that left the head: %+v %v %v", last, ok, err)
	}
}
