package trajectory

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		name, id string
		ok       bool
	}{
		{"path of a run", "run-42/task-7/rollout-3", true},
		{"every allowed character", "a-b_c.d/e:f0", true},
		{"at the limit", strings.Repeat("a", MaxIDLen), true},
		{"empty", "", false},
		{"too long", strings.Repeat("a", MaxIDLen+1), false},
		{"climbs", "run/../other", false},
		{"two dots alone", "a..b", false},
		{"leading slash", "/run", false},
		{"trailing slash", "run/", false},
		{"space", "run 1", false},
		{"star (a subject wildcard)", "run*", false},
		{"greater-than (a subject wildcard)", "run>", false},
		{"non-ASCII", "rün", false},
		{"NUL", "run\x00", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidID(tc.id)
			if tc.ok && err != nil {
				t.Fatalf("ValidID(%q) = %v, want nil", tc.id, err)
			}
			if !tc.ok && (!errors.Is(err, errdefs.Invalid) || errdefs.CodeOf(err) != api.CodeInvalidTrajectoryID) {
				t.Fatalf("ValidID(%q) = %v, want Invalid %s", tc.id, err, api.CodeInvalidTrajectoryID)
			}
		})
	}
}

func TestNewIDAndKey(t *testing.T) {
	a, b := NewID(), NewID()
	if a == b || len(a) != len("traj-")+20 || ValidID(a) != nil {
		t.Fatalf("NewID gave %q and %q", a, b)
	}
	k := key("run-42/task-7/rollout-3")
	if len(k) != 32 || strings.Trim(k, "0123456789abcdef") != "" {
		t.Fatalf("key = %q, want 32 hex digits", k)
	}
	if k == key("run-42/task-7/rollout-4") || k != key("run-42/task-7/rollout-3") {
		t.Fatal("key is not a function of the ID alone")
	}
}
