package grading

import (
	"errors"
	"slices"
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
	pass := []api.TestCase{{Name: "test_a", Status: "passed"}, {Name: "test_b", Status: "passed"}}
	declared := []TestID{{Name: "test_a"}, {Name: "test_b"}}
	hit := RunAudit{Rules: []api.RuleCount{{Rule: "signal-init", Count: 1}}}
	for _, c := range []struct {
		name     string
		cases    []api.TestCase
		timedOut bool
		ev       Evidence
		verdict  string
	}{
		{"all passed", pass, false, Evidence{}, api.VerdictPassed},
		{"expected met", pass, false, Evidence{Expected: 2}, api.VerdictPassed},
		{"fewer than expected", pass, false, Evidence{Expected: 3}, api.VerdictFailed},
		{"a failure", append([]api.TestCase{{Status: "failed"}}, pass...), false, Evidence{}, api.VerdictFailed},
		{"a skip", append([]api.TestCase{{Status: "skipped"}}, pass...), false, Evidence{}, api.VerdictFailed},
		{"an error", append([]api.TestCase{{Status: "error"}}, pass...), false, Evidence{}, api.VerdictFailed},
		{"no tests", nil, false, Evidence{}, api.VerdictError},
		{"no report", nil, false, Evidence{ReportErr: errors.New("no report")}, api.VerdictError},
		{"timed out", pass, true, Evidence{}, api.VerdictError},
		// What the host saw of the run, besides the report.
		{"killed", pass, false, Evidence{ExitCode: -1, Abnormal: "killed"}, api.VerdictError},
		{"exit 1, nothing failed", pass, false, Evidence{ExitCode: 1}, api.VerdictError},
		{"exit 1, a failure", append([]api.TestCase{{Status: "failed"}}, pass...), false, Evidence{ExitCode: 1}, api.VerdictFailed},
		{"a rule hit", pass, false, Evidence{Audited: true, Audit: hit}, api.VerdictError},
		{"another writer", pass, false, Evidence{Audited: true, Audit: RunAudit{Forgers: []string{"pid 7 (sh)"}}}, api.VerdictError},
		{"audit lost", pass, false, Evidence{Audited: true, AuditErr: errors.New("late")}, api.VerdictError},
		{"audited, clean", pass, false, Evidence{Audited: true}, api.VerdictPassed},
		// The tests the tests layer declares.
		{"declared, all ran", pass, false, Evidence{Declared: declared}, api.VerdictPassed},
		{"declared, one missing", pass[:1], false, Evidence{Declared: declared}, api.VerdictFailed},
		{"an undeclared test", append([]api.TestCase{{Name: "test_made_up", Status: "passed"}}, pass...), false, Evidence{Declared: declared}, api.VerdictError},
		{"a test twice", append([]api.TestCase{{Name: "test_a", Status: "passed"}}, pass...), false, Evidence{Declared: declared}, api.VerdictError},
	} {
		res := api.GradeResult{TimedOut: c.timedOut}
		Decide(&res, c.cases, c.ev)
		if res.Verdict != c.verdict || (c.verdict != api.VerdictPassed) != (res.Reason != "") {
			t.Errorf("%s: %s (%s), want %s", c.name, res.Verdict, res.Reason, c.verdict)
		}
	}
}

// TestReadRunAudit: the grader's own process (the run's first exec) and
// a declared reporter program may write the report; any other process
// writing, replacing or removing it is a forger; rule hits count, the
// reporter's own writes of the report aside (the control: an honest
// run's events give no forger and no rule).
func TestReadRunAudit(t *testing.T) {
	const report = "/tmp/dsec-grade/junit.xml"
	exec := func(pid uint32, path string) api.AuditEvent {
		return api.AuditEvent{Kind: "exec", Pid: pid, Comm: "sh", Path: path}
	}
	write := func(pid uint32, call, p, target, rule string) api.AuditEvent {
		return api.AuditEvent{Kind: "syscall", Syscall: call, Pid: pid, Comm: "sh", Path: p, Target: target, Rule: rule, Severity: "medium"}
	}
	honest := []api.AuditEvent{
		exec(10, "/bin/sh"),
		exec(11, "/usr/bin/python3"), // a test the grader runs
		write(11, "openat", "/tmp/scratch", "", ""),
		write(10, "openat", report, "", "test-results"),
	}
	a := ReadRunAudit(honest, report, "")
	if a.Reporter != 10 || len(a.Forgers) != 0 || len(a.Rules) != 0 {
		t.Errorf("an honest run: %+v", a)
	}
	// A reporter that writes a temporary file and renames it over the
	// report.
	atomic := append(honest[:2:2], write(10, "openat", "/tmp/dsec-grade/junit.xml.tmp", "", "test-results"),
		write(10, "renameat2", "/tmp/dsec-grade/junit.xml.tmp", report, "test-results"))
	if a := ReadRunAudit(atomic, report, ""); len(a.Forgers) != 0 || len(a.Rules) != 0 {
		t.Errorf("an honest run writing its report by rename: %+v", a)
	}
	for _, c := range []struct {
		name    string
		evs     []api.AuditEvent
		forgers []string
		rules   []string
	}{
		{"a child writes the report", append(honest, write(11, "openat", report, "", "test-results")), []string{"pid 11 (sh)"}, []string{"test-results"}},
		{"a child renames over it", append(honest, write(11, "renameat2", "/tmp/x", report, "test-results")), []string{"pid 11 (sh)"}, []string{"test-results"}},
		{"a child writes beside it", append(honest, write(11, "openat", "/tmp/dsec-grade/junit-2.xml", "", "test-results")), nil, []string{"test-results"}},
		{"the grader writes a result file elsewhere", append(honest, write(10, "openat", "/tmp/junit.xml", "", "test-results")), nil, []string{"test-results"}},
		{"a child removes it", append(honest, write(11, "unlinkat", report, "", "")), []string{"pid 11 (sh)"}, nil},
		{"kill(-1)", append(honest, api.AuditEvent{Kind: "syscall", Syscall: "kill", Pid: 11, Rule: "signal-init"}), nil, []string{"signal-init"}},
		{"a survivor killed", append(honest, api.AuditEvent{Kind: "phase-kill", Pid: 12, Rule: "phase-survivor"}), nil, []string{"phase-survivor"}},
	} {
		a := ReadRunAudit(c.evs, report, "")
		var rules []string
		for _, r := range a.Rules {
			rules = append(rules, r.Rule)
		}
		if !slices.Equal(a.Forgers, c.forgers) || !slices.Equal(rules, c.rules) {
			t.Errorf("%s: forgers %v, rules %v; want %v, %v", c.name, a.Forgers, rules, c.forgers, c.rules)
		}
	}
	// A pipeline's converter, declared as the reporter, may write it.
	pipeline := []api.AuditEvent{exec(10, "/bin/sh"), write(12, "openat", report, "", "test-results"), exec(12, "/usr/bin/go-junit-report")}
	if a := ReadRunAudit(pipeline, report, "/usr/bin/go-junit-report"); len(a.Forgers) != 0 || len(a.Rules) != 0 {
		t.Errorf("the declared reporter: %+v", a)
	}
	if a := ReadRunAudit(pipeline, report, ""); len(a.Forgers) != 1 {
		t.Errorf("the converter, undeclared: %+v", a)
	}
}

func TestDeclaredTests(t *testing.T) {
	d, err := ParseDeclared([]byte(`{"tests": [{"classname": "tests", "name": "test_add"}, {"name": "test_neg"}]}`))
	if err != nil || len(d) != 2 {
		t.Fatalf("ParseDeclared: %v, %v", d, err)
	}
	for name, bad := range map[string]string{
		"not json": "tests: a", "no tests": `{"tests": []}`, "no name": `{"tests": [{"classname": "x"}]}`,
		"twice": `{"tests": [{"name": "a"}, {"name": "a"}]}`, "unknown field": `{"tests": [{"name": "a"}], "x": 1}`,
	} {
		if _, err := ParseDeclared([]byte(bad)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	cases := []api.TestCase{{ClassName: "tests", Name: "test_add"}, {ClassName: "other", Name: "test_neg"}}
	if u, m, tw := CheckNames(cases, d); len(u)+len(m)+len(tw) != 0 {
		t.Errorf("the declared tests: unknown %v, missing %v, twice %v", u, m, tw)
	}
	cases = []api.TestCase{{ClassName: "other", Name: "test_add"}, {ClassName: "a", Name: "test_neg"}, {ClassName: "b", Name: "test_neg"}}
	u, m, tw := CheckNames(cases, d)
	if !slices.Equal(u, []string{"other::test_add"}) || !slices.Equal(m, []string{"tests::test_add"}) || !slices.Equal(tw, []string{"b::test_neg"}) {
		t.Errorf("unknown %v, missing %v, twice %v", u, m, tw)
	}
	if u, m, tw := CheckNames(cases, nil); u != nil || m != nil || tw != nil {
		t.Error("nothing declared: nothing to check")
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
