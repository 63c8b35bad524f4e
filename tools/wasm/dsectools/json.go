package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// jsonTool reads JSON from stdin and prints it pretty (default), compact
// (-c) or, for a string result, raw (-r). An optional path such as
// .a.b[0] selects a part; a missing part prints null. Invalid input exits 1;
// a bad path or option exits 2. Object keys come out sorted.
func jsonTool(args []string) int {
	compact, raw := false, false
	sel := "."
	for _, a := range args {
		switch {
		case a == "-c":
			compact = true
		case a == "-r":
			raw = true
		case strings.HasPrefix(a, "."):
			sel = a
		default:
			return fail("json", 2, "usage: json [-c] [-r] [.path]")
		}
	}
	steps, err := parsePath(sel)
	if err != nil {
		return fail("json", 2, "%v", err)
	}
	dec := json.NewDecoder(os.Stdin)
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fail("json", 1, "invalid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fail("json", 1, "invalid JSON: trailing data after the value")
	}
	for _, s := range steps {
		v = s.apply(v)
	}
	if s, ok := v.(string); ok && raw {
		fmt.Println(s)
		return 0
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if !compact {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return fail("json", 1, "%v", err)
	}
	os.Stdout.Write(out.Bytes())
	return 0
}

// step is one path element: an object key or an array index.
type step struct {
	key   string
	index int
	isIdx bool
}

func (s step) apply(v any) any {
	if s.isIdx {
		a, ok := v.([]any)
		i := s.index
		if i < 0 && ok {
			i += len(a)
		}
		if !ok || i < 0 || i >= len(a) {
			return nil
		}
		return a[i]
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	return m[s.key]
}

// parsePath parses ".a.b[0]", `."a key"` and "[1][2]" forms.
func parsePath(p string) ([]step, error) {
	var steps []step
	if !strings.HasPrefix(p, ".") {
		return nil, fmt.Errorf("path %q must start with '.'", p)
	}
	i := 1
	for i < len(p) {
		switch c := p[i]; {
		case c == '.':
			i++
		case c == '[':
			end := strings.IndexByte(p[i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("path %q: missing ]", p)
			}
			n, err := strconv.Atoi(p[i+1 : i+end])
			if err != nil {
				return nil, fmt.Errorf("path %q: bad index %q", p, p[i+1:i+end])
			}
			steps = append(steps, step{index: n, isIdx: true})
			i += end + 1
		case c == '"':
			end := strings.IndexByte(p[i+1:], '"')
			if end < 0 {
				return nil, fmt.Errorf("path %q: unterminated quote", p)
			}
			steps = append(steps, step{key: p[i+1 : i+1+end]})
			i += end + 2
		default:
			end := i
			for end < len(p) && p[end] != '.' && p[end] != '[' {
				end++
			}
			steps = append(steps, step{key: p[i:end]})
			i = end
		}
	}
	return steps, nil
}
