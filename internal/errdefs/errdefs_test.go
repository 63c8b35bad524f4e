package errdefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestClassOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Class
		// is: errors.Is(err, want) holds (only for errors carrying a class).
		is bool
	}{
		{"classified", New(NotFound, "sandbox_not_found", "no sandbox %q", "x"), NotFound, true},
		{"wrapped classified", fmt.Errorf("ctx: %w", New(Conflict, "c", "m")), Conflict, true},
		{"bare class", fmt.Errorf("ctx: %w", TooLarge), TooLarge, true},
		{"fs not exist", fmt.Errorf("open: %w", fs.ErrNotExist), NotFound, false},
		{"deadline", context.DeadlineExceeded, DeadlineExceeded, false},
		{"not supported", fmt.Errorf("probe: %w", ErrNotSupported), Unsupported, false},
		{"plain", errors.New("boom"), Internal, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassOf(tt.err); got != tt.want {
				t.Errorf("ClassOf = %q, want %q", got, tt.want)
			}
			if got := errors.Is(tt.err, tt.want); got != tt.is {
				t.Errorf("errors.Is(err, %q) = %v, want %v", tt.want, got, tt.is)
			}
		})
	}
}

func TestMessageHidesInternalCause(t *testing.T) {
	if got := MessageOf(errors.New("secret path /var/lib/x")); got != "internal error" {
		t.Errorf("MessageOf(plain) = %q", got)
	}
	e := Wrap(Unavailable, "node_down", errors.New("dial tcp"), "node %s unreachable", "n1")
	if got := MessageOf(e); got != "node n1 unreachable" {
		t.Errorf("MessageOf = %q", got)
	}
	if CodeOf(e) != "node_down" || CodeOf(NotFound) != "not_found" {
		t.Errorf("CodeOf wrong: %q %q", CodeOf(e), CodeOf(NotFound))
	}
}

func TestParseClassRoundTrip(t *testing.T) {
	for _, c := range Classes {
		if ParseClass(string(c)) != c {
			t.Errorf("ParseClass(%q) round trip failed", c)
		}
	}
	if ParseClass("nonsense") != Internal {
		t.Error("unknown class must parse as Internal")
	}
}

// TestWithinKeepsTheReason: the context's message is followed by a
// classified cause's own message (which is written for users); an
// unclassified cause stays hidden.
func TestWithinKeepsTheReason(t *testing.T) {
	inner := New(Invalid, "invalid_executable", "executable %q: only a trailing /*", "/x/**/y")
	e := Within(Invalid, "invalid_executable", inner, "phase %s", "test")
	if got, want := MessageOf(e), `phase test: executable "/x/**/y": only a trailing /*`; got != want {
		t.Errorf("MessageOf = %q, want %q", got, want)
	}
	hidden := Within(Invalid, "bad", errors.New("secret /var/lib/x"), "phase %s", "test")
	if MessageOf(hidden) != "phase test" || !errors.Is(hidden, Invalid) || hidden.Unwrap() == nil {
		t.Errorf("unclassified cause: message %q, cause %v", MessageOf(hidden), hidden.Unwrap())
	}
}
