package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEvaluate(t *testing.T) {
	tests := []struct {
		name, in, want string
		bad            bool
	}{
		{name: "precedence", in: "1 + 2 * 3", want: "7"},
		{name: "parentheses", in: "(1 + 2) * 3", want: "9"},
		{name: "power is right-associative", in: "2 ^ 3 ^ 2", want: "512"},
		{name: "unary minus binds looser than power", in: "-2 ^ 2", want: "-4"},
		{name: "unary minus", in: "3 - -2", want: "5"},
		{name: "float", in: "1.5 * 4", want: "6"},
		{name: "fraction", in: "1 / 4", want: "0.25"},
		{name: "modulo", in: "7 % 3", want: "1"},
		{name: "exponent notation", in: "2.5e2 + 1", want: "251"},
		{name: "no spaces", in: "2*(3+4)", want: "14"},
		{name: "division by zero", in: "1 / 0", bad: true},
		{name: "modulo by zero", in: "1 % 0", bad: true},
		{name: "dangling operator", in: "1 +", bad: true},
		{name: "unbalanced", in: "(1 + 2", bad: true},
		{name: "junk", in: "1 + x", bad: true},
		{name: "empty", in: "  ", bad: true},
		{name: "overflow", in: "10 ^ 400", bad: true},
		{name: "deep nesting", in: strings.Repeat("-", 5000) + "1", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := evaluate(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("evaluate(%q) = %v, want error", tt.in, v)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := formatNumber(v); got != tt.want {
				t.Errorf("evaluate(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestParsePath(t *testing.T) {
	got, err := parsePath(`.a.b[0]."c d"[-1]`)
	if err != nil {
		t.Fatal(err)
	}
	want := []step{{key: "a"}, {key: "b"}, {index: 0, isIdx: true}, {key: "c d"}, {index: -1, isIdx: true}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(step{})); diff != "" {
		t.Errorf("parsePath (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"a", ".a[x]", ".a[1", `."a`} {
		if _, err := parsePath(bad); err == nil {
			t.Errorf("parsePath(%q) succeeded", bad)
		}
	}
}

func TestCount(t *testing.T) {
	c, err := count(strings.NewReader("hello world\n  two\tlines \nno newline"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (counts{lines: 2, words: 6, bytes: 35}); c != want {
		t.Errorf("count = %+v, want %+v", c, want)
	}
}
