package api

import "time"

// GradeRequest is the body of POST /v1/sandboxes/{id}/grade: run the
// grader for a sandbox's work in a sealed sandbox. The node starts a fresh
// sandbox from the same image with the tests layer laid over it (a layer
// the agent never had), copies in the carried part of the agent's files —
// less the protected ones — and runs Command there with no network and
// nothing of the agent's processes. The verdict comes from the report the
// command writes, parsed by the control plane; never from the exit code
// or anything the agent's sandbox printed.
type GradeRequest struct {
	// TestsLayer is the layer with the pristine tests (name:version or
	// ID). The sandbox being graded must not have it among its layers.
	TestsLayer string `json:"tests_layer"`
	// Cmd (argv) or Command (a command line, as ExecRequest's) runs the
	// grader.
	Cmd     []string `json:"cmd,omitempty"`
	Command string   `json:"command,omitempty"`
	// Report is the JUnit XML file Cmd writes. Its directory starts empty.
	// Default /tmp/dsec-grade/junit.xml (function tier:
	// /workspace/.dsec-grade/junit.xml). Where the node's monitor watches
	// the grading sandbox, only the grader's own process (the one Cmd
	// starts) may write it, or a process running Reporter.
	Report string `json:"report,omitempty"`
	// Reporter, if set, is the absolute path of a program whose
	// processes may write the report besides the grader's own (the
	// converter at the end of a pipeline, `go test -json | go-junit-report
	// > report`).
	Reporter string `json:"reporter,omitempty"`
	// Format of the report: "junit" (the default and only one).
	Format string `json:"format,omitempty"`
	// ExpectedTests, if set, is how many tests must have run: fewer is a
	// failure (tests that never ran cannot pass).
	ExpectedTests int `json:"expected_tests,omitempty"`
	// Carry are the directories of the agent's sandbox whose files the
	// grading sees. Default ["/workspace"].
	Carry []string `json:"carry,omitempty"`
	// Sealed are directories the tests layer owns: whatever the agent put
	// under them is dropped. Default ["/workspace/tests"]. Whatever the
	// lists, a path the tests layer has is never taken from the agent.
	Sealed []string `json:"sealed,omitempty"`
	// Protected are extra glob patterns (** for any depth) of files never
	// carried, in addition to the built-in list (test configuration,
	// conftest.py, Python startup hooks, report files).
	Protected []string `json:"protected,omitempty"`
	// Env is added to the grading sandbox's environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the command's working directory. Default /workspace.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutS bounds the command. Default 300.
	TimeoutS float64 `json:"timeout_s,omitempty"`
}

// Grade verdicts.
const (
	VerdictPassed = "passed"
	VerdictFailed = "failed"
	VerdictError  = "error"
)

// TestCase is one test of a grading report.
type TestCase struct {
	Name      string `json:"name"`
	ClassName string `json:"classname,omitempty"`
	// Status is "passed", "failed", "error" or "skipped".
	Status  string  `json:"status"`
	TimeS   float64 `json:"time_s"`
	Message string  `json:"message,omitempty"`
}

// GradeResult is the answer of POST /v1/sandboxes/{id}/grade.
type GradeResult struct {
	Sandbox string `json:"sandbox"`
	// Grader is the sealed sandbox that ran the grader (destroyed since).
	Grader string `json:"grader"`
	// Verdict is "passed" (the grader exited 0; every test ran and
	// passed, none skipped, at least ExpectedTests of them, exactly the
	// tests the tests layer declares if it declares them; and where the
	// grading sandbox was audited, it hit no audit rule and no process but
	// the grader wrote the report), "failed", or "error" (the run cannot
	// be trusted: the grader timed out, was killed, exited non-zero with
	// no failing test, hit a rule, had its report written by another
	// process, or wrote no usable report); Reason says why when it is not
	// "passed".
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	// DeclaredTests is how many tests the tests layer declares
	// (/.dsec/tests.json; 0: none, the report's names are not checked).
	DeclaredTests int `json:"declared_tests"`
	// Audited says the grading sandbox's own audit counted toward the
	// verdict (false where the node's monitor does not watch its
	// processes: the function and VM tiers, a node without the monitor);
	// GraderRules are the rules it hit while the grader ran, the
	// grader's own writes in the report's directory aside.
	Audited     bool        `json:"audited"`
	GraderRules []RuleCount `json:"grader_rules"`
	// Test counts from the report.
	Tests   int        `json:"tests"`
	Passed  int        `json:"passed"`
	Failed  int        `json:"failed"`
	Errors  int        `json:"errors"`
	Skipped int        `json:"skipped"`
	Cases   []TestCase `json:"cases"`
	// ExitCode and TimedOut are the grader command's: a passing verdict
	// needs exit 0, but exit 0 alone never passes.
	ExitCode   int     `json:"exit_code"`
	TimedOut   bool    `json:"timed_out"`
	DurationMS float64 `json:"duration_ms"`
	// Output is the tail of the grader's stdout and stderr.
	Output string `json:"output,omitempty"`
	// Carried counts the agent's files the grading saw; Discarded lists
	// those it did not, with why ("tests layer": a path the tests layer
	// has, whose copy always wins; protected, sealed, special file).
	Carried      int      `json:"carried"`
	CarriedBytes int64    `json:"carried_bytes"`
	Discarded    []string `json:"discarded"`
	// Integrity is the rollout's audit summary when the grading ran.
	Integrity IntegrityReport `json:"integrity"`
	At        time.Time       `json:"at"`
}

// GradeSummary is a sealed grading as a sandbox's record keeps it.
type GradeSummary struct {
	At         time.Time `json:"at"`
	TestsLayer string    `json:"tests_layer"`
	Verdict    string    `json:"verdict"`
	Reason     string    `json:"reason,omitempty"`
	Tests      int       `json:"tests"`
	Passed     int       `json:"passed"`
	// Discarded counts the agent's files the grading left out.
	Discarded int `json:"discarded"`
}
