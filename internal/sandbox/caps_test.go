package sandbox

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func TestNormalizeExecutables(t *testing.T) {
	got, err := NormalizeExecutables([]string{"/usr/local/go/**", "/bin/*", "/usr//bin/env", "/a/b/../c/**", "/bin/*"})
	if want := []string{"/a/c/**", "/bin/*", "/usr/bin/env", "/usr/local/go/**"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("NormalizeExecutables = %q, %v; want %q", got, err, want)
	}
	for _, tt := range []struct{ in, reason string }{
		{"bin/*", "absolute paths"},
		{"/*", "every program"},
		{"/**", "every program"},
		{"/usr/*/bin", "the only patterns are"},
		{"/usr/**/bin", "the only patterns are"},
		{"/usr/***", "the only patterns are"},
		{"/usr/lib/go-*/bin/*", "the only patterns are"},
		{"/", "not a file"},
	} {
		_, err := NormalizeExecutables([]string{tt.in})
		if !errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != "invalid_executable" || !strings.Contains(errdefs.MessageOf(err), tt.reason) {
			t.Errorf("NormalizeExecutables(%q): %v, want invalid_executable saying %q", tt.in, err, tt.reason)
		}
	}
}

func TestExecutableAllowed(t *testing.T) {
	list := []string{"/usr/local/go/**", "/bin/*", "/usr/bin/env"}
	for p, want := range map[string]bool{
		"/usr/local/go/bin/go":                       true,
		"/usr/local/go/pkg/tool/linux_amd64/compile": true,
		"/usr/local/go":                              false,
		"/usr/local/gopher":                          false,
		"/bin/sh":                                    true,
		"/bin/sub/sh":                                false,
		"/usr/bin/env":                               true,
		"/usr/bin/true":                              false,
		"/tmp/go-build1/b001/x.test":                 false,
	} {
		if got := ExecutableAllowed(list, p); got != want {
			t.Errorf("ExecutableAllowed(%s) = %v, want %v", p, got, want)
		}
	}
	if !ExecutableAllowed(nil, "/anything") {
		t.Error("a nil list must allow everything")
	}
}

// TestPhaseRefusalSaysWhy: a refused phase's message (what users see)
// carries the reason, not only the phase's name.
func TestPhaseRefusalSaysWhy(t *testing.T) {
	for _, p := range []api.Phase{
		{Name: "test", Executables: []string{"/usr/local/go/*/bin"}},
		{Name: "test", Capabilities: []string{"cap_fly"}},
	} {
		err := CheckPhase(Spec{Tier: api.TierContainer}, &p)
		msg := errdefs.MessageOf(err)
		if !errors.Is(err, errdefs.Invalid) || !strings.HasPrefix(msg, "phase test: ") || len(msg) < len("phase test: ")+10 {
			t.Errorf("CheckPhase(%+v): message %q (%v), want the phase and the reason", p, msg, err)
		}
	}
}
