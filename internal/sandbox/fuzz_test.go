package sandbox

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// FuzzCleanPath: whatever the input, the result is a clean absolute path
// inside the root, or an Invalid error.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"a/b", "/workspace/x", "../etc", "/etc/passwd", "a/../../b", ".", "//workspace//a/", "a\x00b", "/workspace/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		for _, root := range []string{"/workspace", "/"} {
			got, err := CleanPath(root, p)
			if err != nil {
				if !errors.Is(err, errdefs.Invalid) {
					t.Fatalf("CleanPath(%q, %q) error %v is not Invalid", root, p, err)
				}
				continue
			}
			if got != path.Clean(got) || !path.IsAbs(got) || !Within(root, got) || strings.Contains(got, "\x00") {
				t.Fatalf("CleanPath(%q, %q) = %q escapes or is not clean", root, p, got)
			}
		}
	})
}

// FuzzSplitCommand: splitting never panics, and what it accepts holds no
// unquoted shell operator.
func FuzzSplitCommand(f *testing.F) {
	for _, s := range []string{`echo 'a b' "c\"d" e\ f`, "a | b", `"unterminated`, "x$y", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := SplitCommand(s)
		if err != nil {
			return
		}
		if len(words) == 0 {
			t.Fatalf("SplitCommand(%q) accepted with no words", s)
		}
	})
}
