package sandbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/google/go-cmp/cmp"
)

func TestCleanPath(t *testing.T) {
	tests := []struct {
		name, root, in, want string
		bad                  bool
	}{
		{name: "relative", root: "/workspace", in: "a/b.txt", want: "/workspace/a/b.txt"},
		{name: "absolute inside", root: "/workspace", in: "/workspace/x//y/", want: "/workspace/x/y"},
		{name: "root itself", root: "/workspace", in: "/workspace", want: "/workspace"},
		{name: "dot", root: "/workspace", in: ".", want: "/workspace"},
		{name: "absolute outside", root: "/workspace", in: "/etc/passwd", bad: true},
		{name: "prefix trick", root: "/workspace", in: "/workspace2/x", bad: true},
		{name: "dotdot relative", root: "/workspace", in: "../etc/passwd", bad: true},
		{name: "dotdot inside relative", root: "/workspace", in: "a/../b", bad: true},
		{name: "dotdot absolute", root: "/workspace", in: "/workspace/../etc", bad: true},
		{name: "nul", root: "/workspace", in: "a\x00b", bad: true},
		{name: "empty", root: "/workspace", in: "", bad: true},
		{name: "long", root: "/workspace", in: strings.Repeat("a", MaxPathLen+1), bad: true},
		{name: "whole system relative", root: "/", in: "etc/hosts", want: "/workspace/etc/hosts"},
		{name: "whole system dot", root: "/", in: ".", want: "/workspace"},
		{name: "whole system dotdot relative", root: "/", in: "../etc/hosts", bad: true},
		{name: "whole system abs", root: "/", in: "/etc/hosts", want: "/etc/hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CleanPath(tt.root, tt.in)
			if tt.bad {
				if !errors.Is(err, errdefs.Invalid) {
					t.Fatalf("CleanPath(%q) = %q, %v; want Invalid error", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("CleanPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
	if got := RelPath("/workspace", "/workspace/a/b"); got != "a/b" {
		t.Errorf("RelPath = %q", got)
	}
	if got := RelPath("/workspace", "/workspace"); got != "." {
		t.Errorf("RelPath(root) = %q", got)
	}
}

// TestMakeWorkdir: the working directory is made once, and an image's own
// is left as it is.
func TestMakeWorkdir(t *testing.T) {
	root := t.TempDir()
	for range 2 {
		if err := MakeWorkdir(root); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(root, Workdir))
	if err != nil || !fi.IsDir() {
		t.Errorf("Workdir in root: %v, %v; want a directory", fi, err)
	}
}

func TestSplitCommand(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
		bad  bool
	}{
		{name: "words", in: "wc -l  file.txt", want: []string{"wc", "-l", "file.txt"}},
		{name: "single quotes", in: `echo 'a b' c`, want: []string{"echo", "a b", "c"}},
		{name: "double quotes", in: `echo "a \"b\" c"`, want: []string{"echo", `a "b" c`}},
		{name: "backslash", in: `echo a\ b`, want: []string{"echo", "a b"}},
		{name: "empty quoted word", in: `echo ''`, want: []string{"echo", ""}},
		{name: "hash inside word", in: `echo a#b`, want: []string{"echo", "a#b"}},
		{name: "pipe", in: "echo a | wc", bad: true},
		{name: "redirect", in: "echo a > f", bad: true},
		{name: "variable", in: "echo $HOME", bad: true},
		{name: "variable in double quotes", in: `echo "$HOME"`, bad: true},
		{name: "glob", in: "ls *.txt", bad: true},
		{name: "list", in: "a; b", bad: true},
		{name: "unterminated", in: `echo 'a`, bad: true},
		{name: "blank", in: "   ", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SplitCommand(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("SplitCommand(%q) = %q, want error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("SplitCommand(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestArgv(t *testing.T) {
	noShell := Capabilities{}
	if _, err := Argv("function", noShell, &ExecRequest{ExecRequest: api.ExecRequest{Command: "a | b"}}); !errors.Is(err, errdefs.Unsupported) {
		t.Errorf("shell syntax without a shell: err = %v, want Unsupported", err)
	}
	got, err := Argv("container", Capabilities{Shell: true}, &ExecRequest{ExecRequest: api.ExecRequest{Command: "a | b"}})
	if err != nil || !cmp.Equal(got, []string{"/bin/sh", "-c", "a | b"}) {
		t.Errorf("with shell: %q, %v", got, err)
	}
	if _, err := Argv("function", noShell, &ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"a"}, Command: "a"}}); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("both set: err = %v, want Invalid", err)
	}
	if _, err := Argv("function", noShell, &ExecRequest{}); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("neither set: err = %v, want Invalid", err)
	}
}

func TestCaptureCapsAndStreams(t *testing.T) {
	var stream bytes.Buffer
	c := NewCapture(10, &stream, true)
	for i := 0; i < 5; i++ {
		if n, err := c.Write([]byte("abcd")); n != 4 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	got, trunc := c.Result()
	if got != "abcdabcdab" || !trunc || stream.String() != got {
		t.Errorf("Result = %q, %v; stream %q", got, trunc, stream.String())
	}
	c2 := NewCapture(10, nil, true)
	c2.Write([]byte("0123456789"))
	if got, trunc := c2.Result(); got != "0123456789" || trunc {
		t.Errorf("exactly at cap: %q, truncated=%v", got, trunc)
	}
}

func TestStateMachine(t *testing.T) {
	allowed := [][2]api.State{
		{api.StatePending, api.StateRunning}, {api.StatePending, api.StateFailed},
		{api.StateRunning, api.StateStopping}, {api.StateStopping, api.StateStopped},
		{api.StateRunning, api.StateFailed},
	}
	for _, tr := range allowed {
		if err := CheckTransition(tr[0], tr[1]); err != nil {
			t.Errorf("%s → %s refused: %v", tr[0], tr[1], err)
		}
	}
	refused := [][2]api.State{
		{api.StateStopped, api.StateRunning}, {api.StateFailed, api.StateRunning},
		{api.StateRunning, api.StatePending}, {api.StateStopped, api.StateStopping},
	}
	for _, tr := range refused {
		if err := CheckTransition(tr[0], tr[1]); !errors.Is(err, errdefs.Conflict) {
			t.Errorf("%s → %s: err = %v, want Conflict", tr[0], tr[1], err)
		}
	}
}
