package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// TestFollowAuditEvents: GET …/events/stream sends the stored events,
// then new ones as the monitor sees them, and ends once the sandbox has.
func TestFollowAuditEvents(t *testing.T) {
	u := startContainers(t)
	c := u.c
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, sb.ID, api.ExecRequest{Command: "mount -t tmpfs none /mnt; true"})
	got := make(chan api.AuditEvent, 1000)
	done := make(chan error, 1)
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	go func() {
		done <- c.FollowAuditEvents(fctx, sb.ID, 0, func(e api.AuditEvent) error {
			got <- e
			return nil
		})
	}()
	// wait returns once an event with rule and path arrives.
	wait := func(rule, path string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case e := <-got:
				if e.Sandbox != sb.ID {
					t.Fatalf("an event of another sandbox: %+v", e)
				}
				if e.Rule == rule && e.Path == path {
					return
				}
			case err := <-done:
				t.Fatalf("the stream ended before %s %s: %v", rule, path, err)
			case <-deadline:
				t.Fatalf("no %s event for %s within 10 s", rule, path)
			}
		}
	}
	wait("mount", "/mnt") // stored before the stream began
	mustExec(t, c, sb.ID, api.ExecRequest{Command: "mkdir -p /w/tests && echo x > /w/tests/test_new.py"})
	wait("test-tampering", "/w/tests/test_new.py") // seen while following
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the stream of an ended sandbox: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("the stream outlives its sandbox by 15 s")
	}
	// A sandbox that does not exist is an error, not an empty stream.
	err = c.FollowAuditEvents(ctx, "sb-nope", 0, func(api.AuditEvent) error { return nil })
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("following an unknown sandbox: %v", err)
	}
}
