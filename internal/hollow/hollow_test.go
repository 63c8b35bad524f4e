package hollow

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestHollowSandbox: every tier is offered; a hollow sandbox's exec
// succeeds with no output and consumes its stdin; its files are refused
// with unsupported_on_tier; once destroyed, everything is NotFound.
func TestHollowSandbox(t *testing.T) {
	ctx := context.Background()
	reg := Registry()
	for _, tier := range Tiers {
		rt, err := reg.Lookup(tier)
		if err != nil {
			t.Fatalf("tier %s: %v", tier, err)
		}
		if info := rt.Fingerprint(ctx); !info.Available || info.Name != tier {
			t.Errorf("fingerprint of %s: %+v", tier, info)
		}
		if !rt.Capabilities().OwnRoot {
			t.Errorf("%s: a hollow tier must take its layers itself (no layer cache)", tier)
		}
	}
	rt, _ := reg.Lookup(api.TierContainer)
	sb, err := rt.Create(ctx, sandbox.Spec{ID: "sb-1", Tier: api.TierContainer})
	if err != nil {
		t.Fatal(err)
	}
	stdin := strings.NewReader("input")
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Command: "make test"}, Stdin: stdin})
	if err != nil || res.ExitCode != 0 || res.Stdout != "" || stdin.Len() != 0 {
		t.Errorf("exec: %+v, %v (stdin left: %d)", res, err, stdin.Len())
	}
	_, err = sb.Files().Write(ctx, "/x", strings.NewReader("x"), sandbox.WriteOptions{})
	if !errors.Is(err, errdefs.Unsupported) || errdefs.CodeOf(err) != api.CodeUnsupportedOnTier {
		t.Errorf("a file write: %v, want unsupported_on_tier", err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{}); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("exec after destroy: %v, want NotFound", err)
	}
	if _, err := sb.Files().Stat(ctx, "/"); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("stat after destroy: %v, want NotFound", err)
	}
	if got, err := rt.Recover(ctx); err != nil || len(got) != 0 {
		t.Errorf("Recover: %v, %v; a hollow runtime recovers nothing", got, err)
	}
}
