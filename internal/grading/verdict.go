package grading

import (
	"fmt"
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// Evidence is what the host knows of a grading run besides the report's
// test cases.
type Evidence struct {
	// ReportErr is why the report could not be read or parsed.
	ReportErr error
	// Expected is how many tests must have run (0: any number).
	Expected int
	// Declared are the tests the tests layer declares (nil: none).
	Declared []TestID
	// ExitCode and Abnormal are how the grader ended: Abnormal is the
	// exec's error ("killed", "signal SIGSEGV", "timeout"…) when it did
	// not exit.
	ExitCode int
	Abnormal string
	// Audited says the grading sandbox's own audit was read; AuditErr why
	// it could not be (the verdict is then an error: the run is not
	// known). Audit is what it showed.
	Audited  bool
	AuditErr error
	Audit    RunAudit
}

// Decide sets res's counts, verdict and reason from the cases of its
// report and what the host saw of the run. A grading passes only if the
// grader ended by exiting, with status 0; if the grading sandbox's
// audit, where it was read, shows no rule hit and no process but the
// grader writing the report; and if the report has at least one test
// (at least Expected, when set; exactly the declared ones, when the
// tests layer declares them), every one of which passed. A skipped test
// is not a pass; exit 0 alone is never one. Anything the host cannot
// account for is an error, not a pass.
func Decide(res *api.GradeResult, cases []api.TestCase, ev Evidence) {
	res.Cases = cases
	if res.Cases == nil {
		res.Cases = []api.TestCase{}
	}
	for _, c := range cases {
		switch c.Status {
		case "passed":
			res.Passed++
		case "failed":
			res.Failed++
		case "error":
			res.Errors++
		case "skipped":
			res.Skipped++
		}
	}
	res.Tests = len(cases)
	res.Audited = ev.Audited
	res.GraderRules = ev.Audit.Rules
	if res.GraderRules == nil {
		res.GraderRules = []api.RuleCount{}
	}
	res.DeclaredTests = len(ev.Declared)
	unknown, missing, twice := CheckNames(cases, ev.Declared)
	switch {
	case res.TimedOut:
		res.Verdict, res.Reason = api.VerdictError, "the grader timed out"
	case ev.Abnormal != "":
		res.Verdict, res.Reason = api.VerdictError, "the grader did not exit: "+ev.Abnormal
	case ev.AuditErr != nil:
		res.Verdict, res.Reason = api.VerdictError, "the grading sandbox's audit: "+ev.AuditErr.Error()
	case len(ev.Audit.Forgers) > 0:
		res.Verdict, res.Reason = api.VerdictError, "the report was written by a process other than the grader: "+strings.Join(ev.Audit.Forgers, ", ")
	case len(ev.Audit.Rules) > 0:
		var hits []string
		for _, r := range ev.Audit.Rules {
			hits = append(hits, fmt.Sprintf("%s ×%d", r.Rule, r.Count))
		}
		res.Verdict, res.Reason = api.VerdictError, "the grading sandbox hit audit rules: "+strings.Join(hits, ", ")
	case ev.ReportErr != nil:
		res.Verdict, res.Reason = api.VerdictError, ev.ReportErr.Error()
	case res.Tests == 0:
		res.Verdict, res.Reason = api.VerdictError, "the report has no tests"
	case len(unknown) > 0:
		res.Verdict, res.Reason = api.VerdictError, "the report names tests the tests layer does not declare: "+list(unknown)
	case len(twice) > 0:
		res.Verdict, res.Reason = api.VerdictError, "the report names tests more than once: "+list(twice)
	case res.Failed+res.Errors+res.Skipped > 0:
		var why []string
		for _, p := range []struct {
			n    int
			what string
		}{{res.Failed, "failed"}, {res.Errors, "errors"}, {res.Skipped, "skipped"}} {
			if p.n > 0 {
				why = append(why, fmt.Sprintf("%d %s", p.n, p.what))
			}
		}
		res.Verdict, res.Reason = api.VerdictFailed, strings.Join(why, ", ")
	case len(missing) > 0:
		res.Verdict, res.Reason = api.VerdictFailed, "declared tests did not run: "+list(missing)
	case ev.Expected > 0 && res.Tests < ev.Expected:
		res.Verdict, res.Reason = api.VerdictFailed, fmt.Sprintf("%d tests ran, %d expected", res.Tests, ev.Expected)
	case ev.ExitCode != 0:
		res.Verdict, res.Reason = api.VerdictError, fmt.Sprintf("the grader exited %d, yet its report has no failing test", ev.ExitCode)
	default:
		res.Verdict, res.Reason = api.VerdictPassed, ""
	}
}

// list joins the first ten of names.
func list(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}
