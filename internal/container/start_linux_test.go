package container

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// TestStartErrorClass: a start that failed because its deadline ran out
// (a node starting too much at once) is a retryable 503 with a retry
// hint; one that failed in time is an internal error, as before.
func TestStartErrorClass(t *testing.T) {
	cause := errors.New("the agent did not answer")
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := startError(expired, "sb-1", cause)
	if !errors.Is(err, errdefs.Unavailable) || errdefs.CodeOf(err) != CodeStartTimeout || errdefs.RetryAfterOf(err) <= 0 || !errors.Is(err, cause) {
		t.Errorf("start past its deadline: %v (%s, retry %v), want unavailable %s with a retry hint", err, errdefs.CodeOf(err), errdefs.RetryAfterOf(err), CodeStartTimeout)
	}
	err = startError(context.Background(), "sb-1", cause)
	if !errors.Is(err, errdefs.Internal) || errdefs.CodeOf(err) != "sandbox_start_failed" {
		t.Errorf("start failed in time: %v (%s), want internal sandbox_start_failed", err, errdefs.CodeOf(err))
	}
}
