package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *gate) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// wantOverloaded checks err is the admission's refusal with a retry hint.
func wantOverloaded(t *testing.T, err error, minRetry time.Duration) {
	t.Helper()
	if !errors.Is(err, errdefs.RateLimited) || errdefs.CodeOf(err) != CodeOverloaded {
		t.Fatalf("error %v (%s), want rate_limited %s", err, errdefs.CodeOf(err), CodeOverloaded)
	}
	if d := errdefs.RetryAfterOf(err); d < minRetry {
		t.Errorf("retry hint %v, want at least %v", d, minRetry)
	}
}

// TestGateSlotsThenFIFO: Slots creates run at once; the next wait and get
// a freed slot in the order they came.
func TestGateSlotsThenFIFO(t *testing.T) {
	g := newGate("n", "container", StartLimits{Slots: 2, Queue: 10, Wait: 10 * time.Second})
	ctx := context.Background()
	var leaves []func()
	for range 2 {
		leave, err := g.enter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, leave)
	}
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			leave, err := g.enter(ctx)
			if err != nil {
				t.Error(err)
				order <- -1
				return
			}
			order <- i
			leave()
		}()
		waitFor(t, fmt.Sprintf("waiter %d in the queue", i), func() bool { return g.queued() == i+1 })
	}
	select {
	case i := <-order:
		t.Fatalf("waiter %d got a slot while both were taken", i)
	case <-time.After(50 * time.Millisecond):
	}
	leaves[0]()
	for want := range 3 {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("waiter %d got a slot, want %d (first come, first served)", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d never got a slot", want)
		}
	}
	leaves[1]()
	waitFor(t, "the slots to be free", func() bool { return len(g.slots) == 0 && g.queued() == 0 })
}

// TestGateRefusesPastQueue: a create finding the queue full is refused
// at once, with a retry hint, and nothing waits for it.
func TestGateRefusesPastQueue(t *testing.T) {
	g := newGate("n", "container", StartLimits{Slots: 1, Queue: 2, Wait: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leave, err := g.enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	for range 2 {
		go func() { _, _ = g.enter(ctx) }()
	}
	waitFor(t, "two waiters", func() bool { return g.queued() == 2 })
	start := time.Now()
	_, err = g.enter(ctx)
	wantOverloaded(t, err, time.Second)
	if d := time.Since(start); d > time.Second {
		t.Errorf("refused after %v, want at once", d)
	}
	// A waiter whose caller gives up leaves the queue.
	cancel()
	waitFor(t, "the queue to empty", func() bool { return g.queued() == 0 })
}

// TestGateRefusesPastWait: a create still waiting at the end of Wait is
// refused (its caller retries later) instead of waiting on.
func TestGateRefusesPastWait(t *testing.T) {
	g := newGate("n", "container", StartLimits{Slots: 1, Queue: 10, Wait: 100 * time.Millisecond})
	leave, err := g.enter(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	start := time.Now()
	_, err = g.enter(context.Background())
	wantOverloaded(t, err, time.Second)
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Errorf("refused after %v, want after the 100ms wait", d)
	}
	if g.queued() != 0 {
		t.Errorf("%d left in the queue", g.queued())
	}
}

// TestGateRefusesByExpectedWait: at the measured pace, a create that
// would wait longer than Wait is refused at once, told to come back
// about when the queue should have room for it; a crowd refused together
// is told to come back spread over the time their starts take.
func TestGateRefusesByExpectedWait(t *testing.T) {
	g := newGate("n", "container", StartLimits{Slots: 1, Queue: 100, Wait: 4 * time.Second})
	g.pace = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leave, err := g.enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	for i := range 4 { // expected waits 1–4 s: admitted
		go func() { _, _ = g.enter(ctx) }()
		waitFor(t, fmt.Sprintf("waiter %d", i), func() bool { return g.queued() == i+1 })
	}
	start := time.Now()
	_, err = g.enter(ctx) // 5 s > 4 s: room in ~1 s, its start ~1 s later
	wantOverloaded(t, err, time.Second)
	if d := errdefs.RetryAfterOf(err); d > 2*time.Second {
		t.Errorf("retry hint %v, want about three quarters of 2s", d)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refused after %v, want at once", d)
	}
	var prev time.Duration
	for i := range 20 {
		_, err := g.enter(ctx)
		wantOverloaded(t, err, time.Second)
		d := errdefs.RetryAfterOf(err)
		if d < prev {
			t.Fatalf("refusal %d told to come back after %v, before the one refused before it (%v)", i, d, prev)
		}
		prev = d
	}
	// 21 refused at one start a second: the last told about 3/4 of ~22 s.
	if prev < 10*time.Second || prev > maxRetryHint {
		t.Errorf("the 21st refusal's hint %v, want the crowd spread over ~15s", prev)
	}
}

// TestGatePace: the pace follows how long creates hold their slots.
func TestGatePace(t *testing.T) {
	g := newGate("n", "container", StartLimits{Slots: 1})
	for range 3 {
		leave, err := g.enter(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		leave()
		leave() // once only
	}
	g.mu.Lock()
	p := g.pace
	g.mu.Unlock()
	if p < 20*time.Millisecond || p > 2*time.Second {
		t.Errorf("pace %v after creates of 20ms", p)
	}
	if len(g.slots) != 0 {
		t.Errorf("%d slots still taken", len(g.slots))
	}
}

func TestStartLimitsDefaults(t *testing.T) {
	l := StartLimits{}.withDefaults("container")
	if l.Slots < 4 || l.Queue <= 0 || l.Wait <= 0 {
		t.Errorf("container defaults %+v", l)
	}
	if l := (StartLimits{Slots: 3, Wait: time.Second}).withDefaults("vm"); l.Slots != 3 || l.Wait != time.Second || l.Queue != 4096 {
		t.Errorf("set fields were replaced: %+v", l)
	}
	if d := DefaultStartLimits("microvm", 2); d.Slots != 2 {
		t.Errorf("microvm on 2 CPUs: %d slots, want 2", d.Slots)
	}
}

// TestTransient: a create that ran the node out of descriptors,
// processes or memory is retryable; other failures keep their class.
func TestTransient(t *testing.T) {
	emfile := errdefs.Wrap(errdefs.Internal, "sandbox_start_failed", &os.PathError{Op: "open", Path: "/x", Err: syscall.EMFILE}, "did not start")
	for _, tt := range []struct {
		name  string
		err   error
		class errdefs.Class
		code  string
	}{
		{"EMFILE deep inside", emfile, errdefs.Unavailable, CodeResourcesExhausted},
		{"EAGAIN plain", fmt.Errorf("fork: %w", syscall.EAGAIN), errdefs.Unavailable, CodeResourcesExhausted},
		{"other internal", errors.New("boom"), errdefs.Internal, "internal"},
		{"invalid stays", errdefs.New(errdefs.Invalid, "bad", "bad"), errdefs.Invalid, "bad"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := transient(tt.err)
			if errdefs.ClassOf(err) != tt.class || errdefs.CodeOf(err) != tt.code {
				t.Errorf("%v: class %s code %s, want %s %s", err, errdefs.ClassOf(err), errdefs.CodeOf(err), tt.class, tt.code)
			}
			if tt.class == errdefs.Unavailable && errdefs.RetryAfterOf(err) <= 0 {
				t.Error("no retry hint")
			}
		})
	}
}
