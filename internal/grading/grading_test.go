package grading

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

const pytestReport = `<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="0.1">
<testcase classname="tests.test_a" name="test_ok" time="0.01"/>
<testcase classname="tests.test_a" name="test_bad" time="0.02"><failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.test_a" name="test_skip" time="0"><skipped message="later"/></testcase>
<testcase classname="tests.test_b" name="test_err"><error message="boom"/><failure message="x"/></testcase>
</testsuite></testsuites>`

func TestParseJUnit(t *testing.T) {
	cases, err := ParseJUnit(strings.NewReader(pytestReport))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"passed", "failed", "skipped", "error"}
	if len(cases) != len(want) {
		t.Fatalf("%d cases, want %d: %+v", len(cases), len(want), cases)
	}
	for i, c := range cases {
		if c.Status != want[i] {
			t.Errorf("case %s: %s, want %s", c.Name, c.Status, want[i])
		}
	}
	if cases[1].Message != "assert 1 == 2\ntrace" || cases[1].TimeS != 0.02 || cases[0].ClassName != "tests.test_a" {
		t.Errorf("case details: %+v", cases[1])
	}
	// A bare testsuite root and nested suites count the same way.
	nested := `<testsuite name="a"><testsuite name="b"><testcase name="x"/></testsuite><testcase name="y"/></testsuite>`
	if cases, err := ParseJUnit(strings.NewReader(nested)); err != nil || len(cases) != 2 {
		t.Errorf("nested suites: %d cases, %v", len(cases), err)
	}
	// Summary attributes claiming passes without test cases count nothing.
	if cases, err := ParseJUnit(strings.NewReader(`<testsuites tests="50" failures="0"/>`)); err != nil || len(cases) != 0 {
		t.Errorf("claimed counts: %d cases, %v", len(cases), err)
	}
	for name, bad := range map[string]string{
		"not xml":      "PASSED 10/10",
		"wrong root":   `<results><testcase name="x"/></results>`,
		"unterminated": `<testsuites><testcase name="x">`,
		"too large":    `<testsuites>` + strings.Repeat(" ", MaxReportBytes) + `</testsuites>`,
		"too deep":     strings.Repeat("<testsuite>", 40) + strings.Repeat("</testsuite>", 40),
	} {
		if _, err := ParseJUnit(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestDecide(t *testing.T) {
	pass := []api.TestCase{{Status: "passed"}, {Status: "passed"}}
	for _, c := range []struct {
		name     string
		cases    []api.TestCase
		err      error
		timedOut bool
		expected int
		verdict  string
	}{
		{"all passed", pass, nil, false, 0, api.VerdictPassed},
		{"expected met", pass, nil, false, 2, api.VerdictPassed},
		{"fewer than expected", pass, nil, false, 3, api.VerdictFailed},
		{"a failure", append([]api.TestCase{{Status: "failed"}}, pass...), nil, false, 0, api.VerdictFailed},
		{"a skip", append([]api.TestCase{{Status: "skipped"}}, pass...), nil, false, 0, api.VerdictFailed},
		{"an error", append([]api.TestCase{{Status: "error"}}, pass...), nil, false, 0, api.VerdictFailed},
		{"no tests", nil, nil, false, 0, api.VerdictError},
		{"no report", nil, errors.New("no report"), false, 0, api.VerdictError},
		{"timed out", pass, nil, true, 0, api.VerdictError},
	} {
		res := api.GradeResult{TimedOut: c.timedOut}
		Decide(&res, c.cases, c.err, c.expected)
		if res.Verdict != c.verdict || (c.verdict != api.VerdictPassed) != (res.Reason != "") {
			t.Errorf("%s: %s (%s), want %s", c.name, res.Verdict, res.Reason, c.verdict)
		}
	}
}

func TestFilter(t *testing.T) {
	f := Filter{Sealed: []string{"/workspace/tests"}, Protected: append(DefaultProtected, "**/secret/**"), ReportDir: "/workspace/.dsec-grade"}
	for _, c := range []struct {
		path, typ string
		keep      bool
		why       string
	}{
		{"/workspace/src/app.py", "file", true, ""},
		{"/workspace/src", "dir", true, ""},
		{"/workspace/testsuite.py", "file", true, ""},
		{"/workspace/tests", "dir", false, "sealed"},
		{"/workspace/tests/test_x.py", "file", false, "sealed"},
		{"/workspace/.dsec-grade/junit.xml", "file", false, "sealed"},
		{"/workspace/conftest.py", "file", false, "protected"},
		{"/workspace/src/conftest.py", "file", false, "protected"},
		{"/workspace/lib/evil.pth", "file", false, "protected"},
		{"/workspace/sitecustomize.py", "file", false, "protected"},
		{"/workspace/src/__pycache__/app.cpython-311.pyc", "file", false, "protected"},
		{"/workspace/junit.xml", "file", false, "protected"},
		{"/workspace/a/secret/b", "file", false, "protected"},
		{"/workspace/link", "symlink", false, "symlink"},
		{"/workspace/fifo", "fifo", false, "fifo"},
	} {
		keep, why := f.Keep(c.path, c.typ)
		if keep != c.keep || why != c.why {
			t.Errorf("%s (%s): keep %v %q, want %v %q", c.path, c.typ, keep, why, c.keep, c.why)
		}
	}
	if !Under("/workspace/a", "/workspace") || Under("/workspacex", "/workspace") || !Under("/x", "/") {
		t.Error("Under")
	}
}

// TestFilterTestsLayerWins: a path the tests layer provides is never
// carried from the agent, whatever the language's layout and whether or
// not the default lists know it (Go's x_test.go and JavaScript's
// x.test.js beside the code; a file where the layer has a directory);
// the agent's other files and a directory both have are carried (the
// control: without the layer's paths the same files are carried).
func TestFilterTestsLayerWins(t *testing.T) {
	provided := map[string]bool{
		"/workspace": true, "/workspace/calc": true, "/workspace/calc/calc_test.go": false,
		"/workspace/web": true, "/workspace/web/src": true, "/workspace/web/src/add.test.js": false,
		"/workspace/fixtures": true,
	}
	for _, c := range []struct {
		path, typ string
		keep      bool
	}{
		{"/workspace/calc/calc_test.go", "file", false},
		{"/workspace/web/src/add.test.js", "file", false},
		{"/workspace/fixtures", "file", false},
		{"/workspace/calc", "dir", true},
		{"/workspace/calc/calc.go", "file", true},
		{"/workspace/calc/extra_test.go", "file", true},
		{"/workspace/web/src/add.js", "file", true},
	} {
		without := Filter{Protected: DefaultProtected}
		if keep, _ := without.Keep(c.path, c.typ); !keep {
			t.Errorf("control: %s is left out without the tests layer's paths", c.path)
		}
		f := Filter{Protected: DefaultProtected, Provided: provided}
		keep, why := f.Keep(c.path, c.typ)
		if keep != c.keep || !keep && why != "tests layer" {
			t.Errorf("%s (%s): keep %v %q, want %v", c.path, c.typ, keep, why, c.keep)
		}
	}
}
