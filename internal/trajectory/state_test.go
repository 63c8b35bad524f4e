package trajectory

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestAppendAfterAgeOut: when a trajectory's oldest steps leave the
// stream (its MaxAge; here a purge does the same), the writer's expected
// sequence is stale though nobody else wrote: the next step is logged.
func TestAppendAfterAgeOut(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "aged", "o")
	appendN(t, s, "aged", 1, 3)
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject("aged"))); err != nil {
		t.Fatal(err)
	}
	appendN(t, s, "aged", 4, 5)
	steps, err := s.Steps(ctx, "aged", 0, 10)
	if err != nil || !slices.Equal(stepNumbers(steps), []int{4, 5}) {
		t.Fatalf("steps = %v, %v", stepNumbers(steps), err)
	}
}

// TestAppendAfterFailedPublish: an append that failed before its ack
// (here its context ended) leaves the writer unsure of the log's end; the
// retry reloads it and is logged once.
func TestAppendAfterFailedPublish(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "failed", "o")
	appendN(t, s, "failed", 1, 1)
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Append(dead, "failed", execStep(2, "w")); err == nil {
		t.Fatal("an append with an ended context succeeded")
	}
	appendN(t, s, "failed", 2, 3)
	if got := subjectMsgs(t, s, "failed"); got != 3 {
		t.Fatalf("the log holds %d messages, want 3", got)
	}
}

// TestEvict: past maxIdle trajectories in memory, clean ones nobody took
// for a minute are dropped; one with counters to flush is kept.
func TestEvict(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	old := time.Now().Add(-2 * time.Minute)
	for i := range maxIdle {
		s.traj(fmt.Sprint("idle-", i)).got = old
	}
	dirty := s.traj("dirty")
	dirty.got, dirty.loaded, dirty.lastStep = old, true, 1
	recent := s.traj("recent")
	s.traj("new")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.trajs["dirty"] != dirty || s.trajs["recent"] != recent || s.trajs["new"] == nil {
		t.Error("a dirty, a recent or the new trajectory was evicted")
	}
	if len(s.trajs) != 3 {
		t.Errorf("%d trajectories in memory, want 3", len(s.trajs))
	}
	dirty.loaded, dirty.lastStep = false, 0 // nothing for Close to flush
}
