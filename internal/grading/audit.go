package grading

import (
	"fmt"
	"path"
	"slices"

	"github.com/dsec-dev/dsec/api"
)

// What the host saw of a grading run, from the grading sandbox's own
// audit events (the node's monitor: every exec, every write, rename and
// link with its process). Solution code runs inside the grader, so the
// report alone proves nothing about who wrote it; these do.

// writeCalls are the calls that create, change or replace a file at
// their path or target.
var writeCalls = []string{"openat", "open", "creat", "truncate", "unlink", "unlinkat",
	"rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat"}

// RunAudit is what a grading run's audit events say.
type RunAudit struct {
	// Reporter is the grader's own process (host pid): the first exec of
	// the run. 0 when the audit shows none.
	Reporter uint32
	// Forgers are the processes other than the reporter that wrote,
	// replaced or removed the report ("pid 123 (sh)").
	Forgers []string
	// Rules are the rules the run hit, counted, the reporter's own
	// writes in the report's directory aside.
	Rules []api.RuleCount
}

// ReadRunAudit reads the audit events of a grading run (those of its
// phase, in order). report is the report's path; reporter, if not "",
// a program (an absolute path) whose processes may write the report
// too, besides the grader's own process (a converter at the end of a
// pipeline: `go test | go-junit-report > report`).
func ReadRunAudit(evs []api.AuditEvent, report, reporter string) RunAudit {
	var a RunAudit
	allowed := map[uint32]bool{}
	for _, e := range evs {
		if e.Kind != "exec" || e.Result < 0 {
			continue
		}
		if a.Reporter == 0 {
			a.Reporter = e.Pid
			allowed[e.Pid] = true
		}
		if reporter != "" && e.Path == reporter {
			allowed[e.Pid] = true
		}
	}
	dir := path.Dir(report)
	forgers := map[string]bool{}
	byRule := map[string]*api.RuleCount{}
	var order []string
	for _, e := range evs {
		if e.Kind == "syscall" && slices.Contains(writeCalls, e.Syscall) {
			switch {
			case (e.Path == report || e.Target == report) && !allowed[e.Pid] && e.Pid != 0:
				forgers[fmt.Sprintf("pid %d (%s)", e.Pid, e.Comm)] = true
			case allowed[e.Pid] && e.Result >= 0 && (Under(e.Path, dir) || e.Target != "" && Under(e.Target, dir)):
				// The reporter's own writes in its report directory (the
				// report, a temporary file renamed over it): the rule
				// they hit (test-results) is expected.
				continue
			}
		}
		if e.Rule == "" {
			continue
		}
		c := byRule[e.Rule]
		if c == nil {
			c = &api.RuleCount{Rule: e.Rule, Severity: e.Severity, First: e.Time}
			byRule[e.Rule] = c
			order = append(order, e.Rule)
		}
		c.Count++
	}
	for _, r := range order {
		a.Rules = append(a.Rules, *byRule[r])
	}
	for f := range forgers {
		a.Forgers = append(a.Forgers, f)
	}
	slices.Sort(a.Forgers)
	return a
}
