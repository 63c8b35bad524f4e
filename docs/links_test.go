package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// A problem is one broken rule, at a line of a file.
type problem struct {
	File string // relative to the repository's root
	Line int
	Msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// markdownFiles lists the Markdown files under root, relative to it,
// leaving out hidden directories (.git, caches) and testdata.
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

var (
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	bareURL    = regexp.MustCompile(`(?i)\b(?:https?|ftp)://[^\s)>\]]+`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	heading    = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	linkText   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// checkLinks checks every link of the Markdown files under root: a
// relative link must lead to a file or directory inside root, and its
// fragment, if any, to a heading of the Markdown file it names. Links
// with a scheme (http:, mailto:…), bare URLs and absolute paths lead
// outside the repository and are refused: the documentation must stand
// on its own for whoever clones it, and a page elsewhere can move or
// vanish. Links in code blocks and code spans are text, not links.
func checkLinks(root string) ([]problem, error) {
	files, err := markdownFiles(root)
	if err != nil {
		return nil, err
	}
	cache := map[string]map[string]bool{}
	anchorsOf := func(rel string) (map[string]bool, error) {
		if a, ok := cache[rel]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		a := anchors(string(b))
		cache[rel] = a
		return a, nil
	}
	var problems []problem
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		text := stripCode(string(b))
		bad := func(off int, format string, args ...any) {
			problems = append(problems, problem{file, 1 + strings.Count(text[:off], "\n"), fmt.Sprintf(format, args...)})
		}
		type link struct {
			off    int
			target string
		}
		var links []link
		for _, m := range inlineLink.FindAllStringSubmatchIndex(text, -1) {
			links = append(links, link{m[0], text[m[2]:m[3]]})
		}
		for _, m := range refDef.FindAllStringSubmatchIndex(text, -1) {
			links = append(links, link{m[0], text[m[2]:m[3]]})
		}
		for _, l := range links {
			t := l.target
			switch {
			case t == "":
				bad(l.off, "empty link")
				continue
			case scheme.MatchString(t):
				bad(l.off, "link %q leads outside the repository", t)
				continue
			case strings.HasPrefix(t, "/"):
				bad(l.off, "link %q is an absolute path; use a path relative to this file", t)
				continue
			}
			path, frag, _ := strings.Cut(t, "#")
			target := file
			if path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
				if target == ".." || strings.HasPrefix(target, "../") {
					bad(l.off, "link %q leads outside the repository", t)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					bad(l.off, "link %q: %s does not exist", t, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				bad(l.off, "link %q names a place in a file that is not Markdown", t)
				continue
			}
			a, err := anchorsOf(target)
			if err != nil {
				return nil, err
			}
			if !a[frag] {
				bad(l.off, "link %q: %s has no heading %q", t, target, frag)
			}
		}
		for _, m := range bareURL.FindAllStringIndex(text, -1) {
			if !insideLink(text, m[0]) {
				bad(m[0], "URL %q leads outside the repository", text[m[0]:m[1]])
			}
		}
	}
	return problems, nil
}

// insideLink reports whether off lies in a link's target, which the
// link checks have already judged.
func insideLink(text string, off int) bool {
	i := strings.LastIndex(text[:off], "](")
	return i >= 0 && !strings.ContainsAny(text[i:off], ")\n")
}

// stripCode blanks out fenced code blocks and code spans, keeping every
// newline so that offsets still give line numbers.
func stripCode(s string) string {
	var out strings.Builder
	fence := ""
	for _, line := range strings.SplitAfter(s, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")) {
			fence = trimmed[:3]
			out.WriteString(blank(line))
			continue
		}
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			out.WriteString(blank(line))
			continue
		}
		out.WriteString(line)
	}
	return stripSpans(out.String())
}

// stripSpans blanks out code spans: a run of n backticks up to the next
// run of exactly n (which may be on a later line of the same paragraph).
func stripSpans(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				if b[j] == '\n' && j+1 < len(b) && b[j+1] == '\n' {
					break // a span ends with its paragraph
				}
				j++
				continue
			}
			m := 0
			for j+m < len(b) && b[j+m] == '`' {
				m++
			}
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		for k := i; k < end; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end
	}
	return string(b)
}

func blank(line string) string {
	if strings.HasSuffix(line, "\n") {
		return "\n"
	}
	return ""
}

// anchors returns the fragments that lead to the headings of a Markdown
// text, named as GitHub names them, and any <a id> or <a name> in it.
func anchors(text string) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")) {
			fence = trimmed[:3]
			continue
		}
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			a[m[1]] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			a[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			a[s] = true
		}
		seen[s]++
	}
	return a
}

// slug is the anchor GitHub gives a heading: its text without markup,
// lower-cased, spaces as hyphens, and punctuation other than hyphens and
// underscores dropped.
func slug(h string) string {
	h = linkText.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
