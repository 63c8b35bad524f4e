package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

// TestContainerPhasesThroughTheAPI: a sandbox created with phases starts
// in the first, moves forward through POST /phase (not back unless told
// to), its commands' results name the phase, and bad phases are refused
// at create with stable codes.
func TestContainerPhasesThroughTheAPI(t *testing.T) {
	u := startContainers(t)
	c := u.c
	ctx := context.Background()
	for _, tc := range []struct {
		code string
		req  api.CreateSandboxRequest
	}{
		{"invalid_phase", api.CreateSandboxRequest{Phases: []api.Phase{{Name: "a"}, {Name: "a"}}}},
		{"invalid_phase", api.CreateSandboxRequest{Phases: []api.Phase{{Name: "a", User: "bob"}}}},
		{"invalid_phase", api.CreateSandboxRequest{Phases: []api.Phase{{Name: "a", Writable: []string{"tmp"}}}}},
		{"network_and_phases", api.CreateSandboxRequest{Network: &api.NetworkPolicy{Egress: "none"}, Phases: []api.Phase{{Name: "a"}}}},
	} {
		tc.req.Tier, tc.req.Image = api.TierContainer, "busybox"
		_, err := c.CreateSandbox(ctx, tc.req)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.StatusCode != 400 || ce.Code != tc.code {
			t.Errorf("create with phases %+v: %v, want 400 %s", tc.req.Phases, err, tc.code)
		}
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox", Phases: []api.Phase{
		{Name: "setup"},
		{Name: "coding", Writable: []string{"/tmp"}, User: "1000"},
		{Name: "submit", Writable: []string{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Phase != "setup" || len(sb.Phases) != 3 {
		t.Fatalf("created %+v", sb)
	}
	res := mustExec(t, c, sb.ID, api.ExecRequest{Command: "id -u"})
	if res.Stdout != "0\n" || res.Phase != "setup" {
		t.Errorf("in setup: %+v", res)
	}
	got, err := c.SetPhase(ctx, sb.ID, "coding", false)
	if err != nil || got.Phase != "coding" {
		t.Fatalf("to coding: %+v, %v", got, err)
	}
	res = mustExec(t, c, sb.ID, api.ExecRequest{Command: "id -u; touch /tmp/a && touch /etc/b"})
	if !strings.HasPrefix(res.Stdout, "1000\n") || !strings.Contains(res.Stderr, "Read-only") || res.Phase != "coding" {
		t.Errorf("in coding: %+v", res)
	}
	for _, bad := range []struct {
		phase string
		back  bool
		code  string
	}{{"setup", false, "phase_backwards"}, {"nope", false, "unknown_phase"}} {
		_, err := c.SetPhase(ctx, sb.ID, bad.phase, bad.back)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != bad.code {
			t.Errorf("to %s: %v, want %s", bad.phase, err, bad.code)
		}
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.Phase != "coding" {
		t.Errorf("after refused changes: %+v, %v", got, err)
	}
	if got, err := c.SetPhase(ctx, sb.ID, "setup", true); err != nil || got.Phase != "setup" {
		t.Errorf("back to setup, allowed: %+v, %v", got, err)
	}
	if res := mustExec(t, c, sb.ID, api.ExecRequest{Command: "id -u; touch /etc/b && echo ok"}); res.Stdout != "0\nok\n" {
		t.Errorf("in setup again: %+v", res)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
