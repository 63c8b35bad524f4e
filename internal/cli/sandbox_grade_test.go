package cli

import (
	"net/http"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

// TestSandboxGrade: the flags become the request, the report is printed,
// and the exit code tells passed (0) from a graded failure (3) and from a
// grading that could not run (1).
func TestSandboxGrade(t *testing.T) {
	var got []api.GradeRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/grade", func(w http.ResponseWriter, r *http.Request) {
		var req api.GradeRequest
		decode(t, r, &req)
		got = append(got, req)
		switch req.TestsLayer {
		case "tests/ok:1":
			writeJSON(w, http.StatusOK, api.GradeResult{Verdict: "passed", Tests: 1, Passed: 1, Cases: []api.TestCase{{Name: "test_a", ClassName: "t", Status: "passed"}}})
		case "tests/forged:1":
			writeJSON(w, http.StatusOK, api.GradeResult{Verdict: "error", Reason: "the grader did not exit: killed", Tests: 1, Passed: 1, Audited: true,
				GraderRules: []api.RuleCount{{Rule: "signal-init", Severity: "medium", Count: 1}}})
		case "tests/bad:1":
			writeJSON(w, http.StatusOK, api.GradeResult{Verdict: "failed", Reason: "1 failed", Tests: 1, Failed: 1,
				Cases: []api.TestCase{{Name: "test_a", Status: "failed", Message: "assert 1 == 2\ntrace"}}, Discarded: []string{"/workspace/conftest.py (protected)"}})
		default:
			writeError(w, http.StatusBadRequest, "tests_layer_seen", "invalid", "the sandbox had that layer")
		}
	})
	res := dsec(t, mux, "sandbox", "grade", "sb-1", "--tests-layer", "tests/ok:1", "--expected-tests", "1", "--carry", "/workspace,/opt/app", "--", "sh", "run.sh", "-x")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "passed: 1 tests, 1 passed") || !strings.Contains(res.stdout, "passed  t.test_a") {
		t.Errorf("passed: %+v", res)
	}
	if len(got) != 1 || strings.Join(got[0].Cmd, " ") != "sh run.sh -x" || got[0].ExpectedTests != 1 || len(got[0].Carry) != 2 {
		t.Errorf("request: %+v", got)
	}
	res = dsec(t, mux, "sandbox", "grade", "sb-1", "--tests-layer", "tests/bad:1", "--", "sh", "run.sh")
	if res.code != exitNotPassed || !strings.Contains(res.stdout, "failed: 1 tests") || !strings.Contains(res.stdout, "assert 1 == 2\n") || !strings.Contains(res.stdout, "conftest.py (protected)") {
		t.Errorf("failed: %+v", res)
	}
	res = dsec(t, mux, "sandbox", "grade", "sb-1", "--tests-layer", "tests/forged:1", "--reporter", "/usr/bin/go-junit-report", "--", "sh", "run.sh")
	if res.code != exitNotPassed || !strings.Contains(res.stdout, "error: 1 tests") || !strings.Contains(res.stdout, "hit: signal-init (medium) ×1") || got[len(got)-1].Reporter != "/usr/bin/go-junit-report" {
		t.Errorf("forged: %+v", res)
	}
	res = dsec(t, mux, "sandbox", "grade", "sb-1", "--tests-layer", "tests/seen:1", "--", "sh")
	if res.code != exitError || !strings.Contains(res.stderr, "tests_layer_seen") {
		t.Errorf("refused: %+v", res)
	}
	if res := dsec(t, mux, "sandbox", "grade", "sb-1", "sh", "run.sh"); res.code != exitUsage {
		t.Errorf("no --: %+v", res)
	}
}
