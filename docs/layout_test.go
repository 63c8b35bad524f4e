package docs

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// layoutPaths returns the paths a layout table lists: under the heading
// section (a "## " heading), the backticked paths of the table's column
// named col, each with the line it is on.
func layoutPaths(text, section, col string) (map[string]int, error) {
	paths := map[string]int{}
	in, column := false, -1
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "## ") {
			in = line == "## "+section
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if column < 0 {
			for i, c := range cells {
				if strings.TrimSpace(c) == col {
					column = i
				}
			}
			if column < 0 {
				return nil, fmt.Errorf("section %q: the table has no column %q", section, col)
			}
			continue
		}
		if column >= len(cells) || strings.Trim(cells[column], " -:") == "" {
			continue // the delimiter row, or a row continuing a group
		}
		if f := strings.Split(cells[column], "`"); len(f) >= 3 {
			if p := strings.TrimSuffix(strings.TrimSpace(f[1]), "/"); p != "" && !strings.ContainsAny(p, " ,") {
				paths[p] = n
			}
		}
	}
	if column < 0 {
		return nil, fmt.Errorf("no table under %q", section)
	}
	return paths, nil
}

// checkLayout compares a layout table's paths with the module's packages:
// every package must be listed, and every listed path must exist under
// root.
func checkLayout(root, file string, listed map[string]int, packages []string) []problem {
	var problems []problem
	for _, p := range packages {
		if _, ok := listed[p]; !ok {
			problems = append(problems, problem{file, 0, fmt.Sprintf("package %s is missing from the layout", p)})
		}
	}
	for p, line := range listed {
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
			problems = append(problems, problem{file, line, fmt.Sprintf("the layout lists %s, which is no directory of the repository", p)})
		}
	}
	slices.SortFunc(problems, func(a, b problem) int { return strings.Compare(a.String(), b.String()) })
	return problems
}

// modulePackages lists the directories of the module's packages,
// relative to root.
func modulePackages(root string) ([]string, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "list", "-f", "{{.Dir}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []string
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, filepath.ToSlash(rel))
	}
	return pkgs, nil
}
