package cli

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) trajStepsCmd() *cobra.Command {
	var after, limit int
	cmd := &cobra.Command{
		Use:   "steps ID",
		Short: "List a trajectory's steps: number, kind, whether pure, duration and what it did",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if after < 0 || limit < 0 {
				return usagef("--after and --limit must not be negative")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			steps := []api.TrajectoryStep{}
			for s, err := range c.AllTrajectorySteps(cmd.Context(), argv[0], after) {
				if err != nil {
					return err
				}
				steps = append(steps, s)
				if limit > 0 && len(steps) == limit {
					break
				}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), steps)
			}
			tw := newTable(cmd.OutOrStdout(), "STEP", "KIND", "PURE", "DURATION", "SUMMARY")
			for _, s := range steps {
				pure := "-"
				if s.Pure {
					pure = "yes"
				}
				row(tw, strconv.Itoa(s.Step), s.Kind, pure, stepDuration(s.DurationMS), stepSummary(s))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&after, "after", 0, "only the steps after this step number")
	cmd.Flags().IntVar(&limit, "limit", 0, "most steps to show (default all)")
	return cmd
}

// stepDuration formats milliseconds: 12ms, 1.5s, or "-" for none.
func stepDuration(ms float64) string {
	switch {
	case ms <= 0:
		return "-"
	case ms < 1000:
		return fmt.Sprintf("%.0fms", ms)
	}
	return fmt.Sprintf("%.1fs", ms/1000)
}

// summaryWidth bounds a step's summary in the table.
const summaryWidth = 60

// stepSummary says in a few words what a step did.
func stepSummary(s api.TrajectoryStep) string {
	var out string
	switch {
	case s.Create != nil:
		r := s.Create.Request
		out = strings.TrimSpace(r.Tier + " " + r.Image)
		if s.Create.FromSnapshot != "" {
			out += " from " + s.Create.FromSnapshot
		}
	case s.Exec != nil:
		e := s.Exec
		cmd := e.Request.Command
		if len(e.Request.Cmd) > 0 {
			cmd = strings.Join(e.Request.Cmd, " ")
		}
		switch {
		case e.Process:
			out = fmt.Sprintf("%s → pid %d", cmd, e.Pid)
		case e.TimedOut:
			out = cmd + " → timed out"
		default:
			out = fmt.Sprintf("%s → exit %d", cmd, e.ExitCode)
		}
	case s.File != nil:
		f := s.File
		switch {
		case f.To != "":
			out = f.Path + " → " + f.To
		case s.Kind == api.KindWrite:
			out = fmt.Sprintf("%s (%s)", f.Path, humanBytes(f.Size))
		default:
			out = f.Path
		}
	case s.Phase != nil:
		out = s.Phase.Phase
	case s.Snapshot != nil:
		out = s.Snapshot.ID
	case s.Resume != nil:
		r := s.Resume
		out = fmt.Sprintf("%s: replayed %d, skipped %d", orDash(r.Reason), r.Replayed, r.Skipped)
		if r.Divergence != nil {
			out += fmt.Sprintf(", diverged at step %d", r.Divergence.Step)
		}
	case s.End != nil:
		out = s.End.Reason
	}
	return orDash(shorten(strings.Join(strings.Fields(out), " "), summaryWidth))
}

// shorten cuts s to at most n runes, marking the cut with "…".
func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
