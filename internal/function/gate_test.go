package function

import (
	"context"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestGateHold: a hold waits for the operation in progress, keeps new
// ones waiting until released, and gives up at its context's end.
func TestGateHold(t *testing.T) {
	var g gate
	if !g.enter() {
		t.Fatal("enter on an open gate")
	}
	held := make(chan func(), 1)
	go func() {
		release, ok, err := g.hold(context.Background())
		if !ok || err != nil {
			t.Errorf("hold: %v %v", ok, err)
		}
		held <- release
	}()
	select {
	case <-held:
		t.Fatal("the hold did not wait for the operation in progress")
	case <-time.After(50 * time.Millisecond):
	}
	g.leave()
	release := testenv.Recv(t, held, 10*time.Second, "the hold after the operation ended")
	entered := make(chan bool, 1)
	go func() { entered <- g.enter() }()
	select {
	case <-entered:
		t.Fatal("an operation entered a held gate")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if !testenv.Recv(t, entered, 10*time.Second, "the operation after the release") {
		t.Fatal("enter after the release failed")
	}
	// A hold that cannot drain gives up at its deadline, and lets
	// operations in again.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, ok, err := g.hold(ctx); ok || err == nil {
		t.Fatalf("hold with an operation that never ends: %v %v", ok, err)
	}
	if !g.enter() {
		t.Fatal("enter after a hold gave up")
	}
	g.leave()
	g.leave()
	// Closing refuses holds and waiting operations.
	testenv.Recv(t, g.close(), 30*time.Second, "the gate to close")
	if _, ok, err := g.hold(context.Background()); ok || err != nil {
		t.Fatalf("hold on a closed gate: %v %v", ok, err)
	}
}
