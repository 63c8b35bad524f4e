package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const root = ".." // the repository, from this package's directory

// TestMarkdownLinks requires every link of every Markdown file of the
// repository to lead to a file of the repository (and to a heading of
// it, if it names one), and none to lead outside.
func TestMarkdownLinks(t *testing.T) {
	problems, err := checkLinks(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestLayoutTables requires the layout tables of README.md and
// docs/README.md to list every package of the module, and nothing that
// does not exist.
func TestLayoutTables(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command to list the packages: %v", err)
	}
	pkgs, err := modulePackages(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, section, column string }{
		{"README.md", "Layout", "path"},
		{"docs/README.md", "The package map", "package"},
	} {
		b, err := os.ReadFile(filepath.Join(root, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		listed, err := layoutPaths(string(b), tc.section, tc.column)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		for _, p := range checkLayout(root, tc.file, listed, pkgs) {
			t.Error(p)
		}
	}
}

// TestCheckLinksFindsBrokenLinks shows that the link check fails on each
// kind of bad link and passes the good ones.
func TestCheckLinksFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/b.md", "# B\n\n## The agent's liveness (`internal/x`)\n\n## Twice\n\n## Twice\n")
	write("pkg/x.go", "package x\n")
	write(".hidden/skipped.md", "[skipped](nowhere.md)\n")
	write("a.md", strings.Join([]string{
		"# A",
		"[good](docs/b.md) [dir](pkg/) [file](pkg/x.go) [here](#a)",
		"[anchor](docs/b.md#the-agents-liveness-internalx) [second](docs/b.md#twice-1)",
		"[wrapped",
		"text](docs/b.md)",
		"`[in a span](missing-in-span.md)` and:",
		"```",
		"[in a block](missing-in-block.md) https://in.a.block",
		"```",
		"[missing](docs/nope.md)",
		"[bad anchor](docs/b.md#nope)",
		"[web](https://example.com/page)",
		"[absolute](/etc/passwd)",
		"[out](../outside.md)",
		"[go anchor](pkg/x.go#L1)",
		"see https://example.org for more",
		"[ref]: docs/gone.md",
		"",
	}, "\n"))
	problems, err := checkLinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := []string{
		`a.md:10: link "docs/nope.md": docs/nope.md does not exist`,
		`a.md:11: link "docs/b.md#nope": docs/b.md has no heading "nope"`,
		`a.md:12: link "https://example.com/page" leads outside the repository`,
		`a.md:13: link "/etc/passwd" is an absolute path; use a path relative to this file`,
		`a.md:14: link "../outside.md" leads outside the repository`,
		`a.md:15: link "pkg/x.go#L1" names a place in a file that is not Markdown`,
		`a.md:16: URL "https://example.org" leads outside the repository`,
		`a.md:17: link "docs/gone.md": docs/gone.md does not exist`,
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ name, heading, want string }{
		{"plain", "The warm pool", "the-warm-pool"},
		{"apostrophe", "QEMU's least privilege", "qemus-least-privilege"},
		{"code", "The host side: `internal/agentsandbox`", "the-host-side-internalagentsandbox"},
		{"hyphen", "The cgroup-bpf guard", "the-cgroup-bpf-guard"},
		{"link", "See [the map](README.md)", "see-the-map"},
		{"digits", "Issue 13: 2,000 creates", "issue-13-2000-creates"},
	} {
		if got := slug(tc.heading); got != tc.want {
			t.Errorf("%s: slug(%q) = %q, want %q", tc.name, tc.heading, got, tc.want)
		}
	}
}

// TestLayoutCheckFindsGaps shows that the layout check fails on a package
// the table leaves out and on a path that does not exist.
func TestLayoutCheckFindsGaps(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"cmd/tool", "internal/a", "internal/b"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	readme := "# X\n\n## Layout\n\n| path | what |\n|---|---|\n| `cmd/tool` | the tool |\n| `internal/a/` | a |\n| `internal/gone` | moved away |\n\n## Next\n\n| path | what |\n|---|---|\n| `internal/ignored` | another section |\n"
	listed, err := layoutPaths(readme, "Layout", "path")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range checkLayout(dir, "README.md", listed, []string{"cmd/tool", "internal/a", "internal/b"}) {
		got = append(got, p.String())
	}
	want := []string{
		"README.md:0: package internal/b is missing from the layout",
		"README.md:9: the layout lists internal/gone, which is no directory of the repository",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := layoutPaths(readme, "Missing", "path"); err == nil {
		t.Error("a missing section was not reported")
	}
}
