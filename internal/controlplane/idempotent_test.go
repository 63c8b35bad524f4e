package controlplane

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestCreateOnce: creates with a request_id make one sandbox however
// often they are repeated, at once or after; the same key with another
// request is refused; another owner's same key is its own; a create that
// made nothing frees its key for the retry; a bad key is refused.
func TestCreateOnce(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := context.Background()
	req := api.CreateSandboxRequest{Tier: api.TierFunction, RequestID: "job-7/rollout-1"}

	// Two at once while the node still makes the first.
	release := make(chan struct{})
	var nodeCreates atomic.Int32
	h.nodes.onCreate = func(node string, r noderpc.CreateRequest) error {
		nodeCreates.Add(1)
		hold(release)
		return nil
	}
	type result struct {
		sb  api.Sandbox
		err error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			sb, err := h.m.Create(ctx, "o", req)
			results <- result{sb, err}
		}()
	}
	time.Sleep(100 * time.Millisecond) // both in: one at the node, one waiting for it
	close(release)
	a := testenv.Recv(t, results, 30*time.Second, "a create")
	b := testenv.Recv(t, results, 30*time.Second, "the other create")
	if a.err != nil || b.err != nil || a.sb.ID != b.sb.ID || a.sb.State != api.StateRunning {
		t.Fatalf("two creates with one request_id: %+v, %v / %+v, %v", a.sb, a.err, b.sb, b.err)
	}
	// Later, again: the same sandbox, nothing new on the node.
	again, err := h.m.Create(ctx, "o", req)
	if err != nil || again.ID != a.sb.ID || nodeCreates.Load() != 1 {
		t.Errorf("a repeat: %+v, %v; node creates %d, want the same sandbox and 1", again, err, nodeCreates.Load())
	}
	// The same key, another request.
	other := req
	other.MemoryMB = 512
	_, err = h.m.Create(ctx, "o", other)
	if errdefs.CodeOf(err) != api.CodeRequestIDReused {
		t.Errorf("the key with another request: %v, want request_id_reused", err)
	}
	// Another owner's same key is another key.
	theirs, err := h.m.Create(ctx, "p", req)
	if err != nil || theirs.ID == a.sb.ID {
		t.Errorf("another owner's create with the same request_id: %+v, %v", theirs, err)
	}
	// A create that made nothing frees its key.
	h.nodes.onCreate = func(node string, r noderpc.CreateRequest) error {
		return errdefs.New(errdefs.Unavailable, "node_busy", "busy")
	}
	failed := api.CreateSandboxRequest{Tier: api.TierFunction, RequestID: "job-8"}
	if _, err := h.m.Create(ctx, "o", failed); !errors.Is(err, errdefs.Unavailable) {
		t.Fatalf("a create the node refused: %v", err)
	}
	h.nodes.onCreate = nil
	retried, err := h.m.Create(ctx, "o", failed)
	if err != nil || retried.State != api.StateRunning {
		t.Errorf("the retry of a create that made nothing: %+v, %v", retried, err)
	}
	bad := api.CreateSandboxRequest{Tier: api.TierFunction, RequestID: "no spaces"}
	if _, err := h.m.Create(ctx, "o", bad); errdefs.CodeOf(err) != api.CodeInvalidRequestID {
		t.Errorf("a bad request_id: %v, want invalid_request_id", err)
	}
}
