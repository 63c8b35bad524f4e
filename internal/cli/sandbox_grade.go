package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

// exitNotPassed is dsec sandbox grade's exit code for a verdict other
// than passed, so scripts can tell "graded, failed" from "could not grade"
// (1).
const exitNotPassed = 3

func (a *app) sandboxGradeCmd() *cobra.Command {
	var req api.GradeRequest
	cmd := &cobra.Command{
		Use:   "grade ID --tests-layer LAYER [flags] -- COMMAND [ARG...]",
		Short: "Run the grader on a sandbox's work in a sealed sandbox with pristine tests",
		Long: `Run the grader on a sandbox's work in a sealed sandbox: a fresh sandbox from
the same image with the tests layer on top, the agent's files under --carry
(less test configuration, Python startup hooks, result files and anything
under --sealed; a file the tests layer has always wins), no network and none
of the agent's processes. COMMAND must write a JUnit report to --report, from
its own process (or one running --reporter); the verdict comes from that
report and from what the node saw of the run: a pass needs exit 0, no audit
rule hit in the grading sandbox, no other writer of the report, and the
tests the tests layer declares, but exit 0 alone never passes. Exits 0 when
the verdict is passed, 3 when it is failed or error, 1 when the grading could
not run.`,
		Args: args(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return usagef("give the grader's command after --: dsec sandbox grade ID --tests-layer LAYER -- COMMAND")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			req.Cmd = argv[1:]
			res, err := c.Grade(cmd.Context(), argv[0], req)
			if err != nil {
				return err
			}
			if a.json {
				err = printJSON(cmd.OutOrStdout(), res)
			} else {
				err = printGrade(cmd, res)
			}
			if err == nil && res.Verdict != api.VerdictPassed {
				return &ExitError{Code: exitNotPassed}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.TestsLayer, "tests-layer", "", "the layer with the pristine tests (name:version or ID)")
	f.StringVar(&req.Report, "report", "", "the JUnit file the command writes (default /tmp/dsec-grade/junit.xml)")
	f.StringVar(&req.Reporter, "reporter", "", "a program (absolute path) whose processes may write the report besides the command's own")
	f.IntVar(&req.ExpectedTests, "expected-tests", 0, "how many tests must run (fewer fails)")
	f.StringSliceVar(&req.Carry, "carry", nil, "directories of the agent's files to carry (default /workspace)")
	f.StringSliceVar(&req.Sealed, "sealed", nil, "directories the tests layer owns (default /workspace/tests)")
	f.StringSliceVar(&req.Protected, "protected", nil, "more glob patterns of files never carried")
	f.StringVar(&req.Cwd, "cwd", "", "the command's working directory (default /workspace)")
	f.Float64Var(&req.TimeoutS, "timeout", 0, "seconds the grader may run (default 300)")
	return cmd
}

func printGrade(cmd *cobra.Command, res *api.GradeResult) error {
	w := cmd.OutOrStdout()
	line := fmt.Sprintf("%s: %d tests, %d passed, %d failed, %d errors, %d skipped", res.Verdict, res.Tests, res.Passed, res.Failed, res.Errors, res.Skipped)
	if res.Reason != "" {
		line += " (" + res.Reason + ")"
	}
	fmt.Fprintln(w, line)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, tc := range res.Cases {
		name := tc.Name
		if tc.ClassName != "" {
			name = tc.ClassName + "." + name
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", tc.Status, name, firstLine(tc.Message))
	}
	tw.Flush()
	if len(res.Discarded) > 0 {
		fmt.Fprintf(w, "left out of the agent's files: %s\n", strings.Join(res.Discarded, ", "))
	}
	if len(res.GraderRules) > 0 {
		var hits []string
		for _, r := range res.GraderRules {
			hits = append(hits, fmt.Sprintf("%s (%s) ×%d", r.Rule, r.Severity, r.Count))
		}
		fmt.Fprintf(w, "audit rules the grading sandbox hit: %s\n", strings.Join(hits, ", "))
	} else if !res.Audited {
		fmt.Fprintln(w, "the grading sandbox's processes were not audited (no monitor sees them)")
	}
	_, err := fmt.Fprintf(w, "carried %d files (%d bytes); grader exit code %d; %.0f ms\n", res.Carried, res.CarriedBytes, res.ExitCode, res.DurationMS)
	return err
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
