package builtin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// defaultMirror is used when the host's apt configuration names no
// Debian bookworm main repository.
const defaultMirror = "http://deb.debian.org/debian"

// aptMirror returns the Debian mirror of the apt configuration under root
// ("/" for the host): the first http(s) URI of a "deb" bookworm main
// repository in /etc/apt/sources.list, then in /etc/apt/sources.list.d/
// (*.list one-line files and *.sources deb822 files, in name order, as apt
// reads them), or else defaultMirror.
func aptMirror(root string) string {
	files := []string{filepath.Join(root, "etc/apt/sources.list")}
	d := filepath.Join(root, "etc/apt/sources.list.d")
	entries, _ := os.ReadDir(d) // none: just sources.list
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".list") || strings.HasSuffix(n, ".sources") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		files = append(files, filepath.Join(d, n))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var repos []aptRepo
		if strings.HasSuffix(f, ".sources") {
			repos = parseDeb822(string(b))
		} else {
			repos = parseOneLine(string(b))
		}
		for _, r := range repos {
			if u, ok := r.bookwormMain(); ok {
				return u
			}
		}
	}
	return defaultMirror
}

// aptRepo is one sources entry (a line, or a deb822 stanza).
type aptRepo struct {
	types, uris, suites, components []string
	disabled                        bool
}

// bookwormMain returns the entry's first http(s) URI if it is a "deb"
// repository of suite bookworm with component main.
func (r aptRepo) bookwormMain() (string, bool) {
	if r.disabled || !slices.Contains(r.types, "deb") || !slices.Contains(r.suites, "bookworm") || !slices.Contains(r.components, "main") {
		return "", false
	}
	for _, u := range r.uris {
		if strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") {
			return strings.TrimRight(u, "/"), true
		}
	}
	return "", false
}

// parseOneLine parses sources.list lines:
// "deb [opt=val …] URI SUITE COMPONENT…".
func parseOneLine(s string) []aptRepo {
	var out []aptRepo
	for _, line := range strings.Split(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], "[") {
			// Options, possibly with spaces inside the brackets.
			end := 1
			for end < len(f) && !strings.HasSuffix(f[end], "]") {
				end++
			}
			f = append(f[:1], f[min(end+1, len(f)):]...)
		}
		if len(f) < 3 {
			continue
		}
		out = append(out, aptRepo{types: f[:1], uris: f[1:2], suites: f[2:3], components: f[3:]})
	}
	return out
}

// parseDeb822 parses deb822 .sources stanzas (Types, URIs, Suites,
// Components, Enabled), separated by blank lines.
func parseDeb822(s string) []aptRepo {
	var out []aptRepo
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) > 0 {
			out = append(out, aptRepo{
				types:      strings.Fields(fields["types"]),
				uris:       strings.Fields(fields["uris"]),
				suites:     strings.Fields(fields["suites"]),
				components: strings.Fields(fields["components"]),
				disabled:   strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no"),
			})
		}
		fields, last = map[string]string{}, ""
	}
	for _, line := range strings.Split(s, "\n") {
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
