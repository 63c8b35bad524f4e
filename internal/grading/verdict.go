package grading

import (
	"fmt"
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// Decide sets res's counts, verdict and reason from the cases of its
// report. A grading passes only if it produced at least one test (and
// at least expected, when set), every one of which passed: a skipped
// test is not a pass, the exit code is never looked at, and a run that
// timed out or wrote no report is an error whatever it printed.
func Decide(res *api.GradeResult, cases []api.TestCase, reportErr error, expected int) {
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
	switch {
	case res.TimedOut:
		res.Verdict, res.Reason = api.VerdictError, "the grader timed out"
	case reportErr != nil:
		res.Verdict, res.Reason = api.VerdictError, reportErr.Error()
	case res.Tests == 0:
		res.Verdict, res.Reason = api.VerdictError, "the report has no tests"
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
	case expected > 0 && res.Tests < expected:
		res.Verdict, res.Reason = api.VerdictFailed, fmt.Sprintf("%d tests ran, %d expected", res.Tests, expected)
	default:
		res.Verdict, res.Reason = api.VerdictPassed, ""
	}
}
