package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func (a *app) trajCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "traj",
		Aliases: []string{"trajectory"},
		Short:   "Read, export, resume and delete trajectories: the durable logs of rollouts",
	}
	cmd.AddCommand(
		a.trajListCmd(),
		a.trajGetCmd(),
		a.trajStepsCmd(),
		a.trajExportCmd(),
		a.trajResumeCmd(),
		a.trajRemoveCmd(),
	)
	return cmd
}

func (a *app) trajListCmd() *cobra.Command {
	var (
		limit int
		all   bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List trajectories",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usagef("--limit must not be negative")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var l api.TrajectoryList
			seen := map[string]bool{}
			for token := ""; ; {
				page, err := c.ListTrajectories(cmd.Context(), token, limit)
				if err != nil {
					return err
				}
				l.Trajectories = append(l.Trajectories, page.Trajectories...)
				l.NextPageToken = page.NextPageToken
				if !all || page.NextPageToken == "" {
					break
				}
				if seen[page.NextPageToken] {
					return errors.New("listing trajectories: server repeated a page token")
				}
				seen[page.NextPageToken] = true
				token = page.NextPageToken
			}
			if l.Trajectories == nil {
				l.Trajectories = []api.Trajectory{}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			now := a.env.now()
			tw := newTable(cmd.OutOrStdout(), "ID", "STATE", "STEPS", "SANDBOX", "TIER", "SIZE", "UPDATED")
			for _, t := range l.Trajectories {
				row(tw, t.ID, t.State, strconv.Itoa(t.Steps), orDash(t.Sandbox), orDash(t.Tier), humanBytes(t.Bytes),
					humanDuration(max(now.Sub(t.UpdatedAt), 0))+" ago")
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if l.NextPageToken != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "(more trajectories: list them all with --all)")
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "page size (default: the server's)")
	cmd.Flags().BoolVar(&all, "all", false, "list every page, not just the first")
	return cmd
}

func (a *app) trajGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"inspect"},
		Short:   "Describe a trajectory: its state, sandbox, steps, snapshots and incarnations",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.Trajectory(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			return describeTrajectory(cmd.OutOrStdout(), t)
		},
	}
}

func describeTrajectory(w io.Writer, t api.Trajectory) error {
	tw := newTable(w, "ID:", t.ID)
	row(tw, "State:", t.State)
	row(tw, "Sandbox:", orDash(t.Sandbox))
	row(tw, "Tier:", orDash(t.Tier))
	if t.Parent != "" {
		row(tw, "Forked from:", fmt.Sprintf("%s after step %d", t.Parent, t.ParentStep))
	}
	row(tw, "Steps:", strconv.Itoa(t.Steps))
	row(tw, "Size:", humanBytes(t.Bytes))
	row(tw, "Incarnations:", strconv.Itoa(t.Incarnations))
	snaps := make([]string, len(t.Snapshots))
	for i, s := range t.Snapshots {
		snaps[i] = fmt.Sprintf("%s (step %d)", s.ID, s.Step)
	}
	row(tw, "Snapshots:", orDash(strings.Join(snaps, ", ")))
	if t.Divergence != nil {
		row(tw, "Divergence:", divergenceText(t.Divergence))
	}
	if t.ResumeOnPreempt {
		row(tw, "Resume on preempt:", "yes")
	}
	row(tw, "Created:", t.CreatedAt.Format(time.RFC3339))
	row(tw, "Updated:", t.UpdatedAt.Format(time.RFC3339))
	row(tw, "Expires:", t.ExpiresAt.Format(time.RFC3339))
	return tw.Flush()
}

// divergenceText says where a replay diverged and how.
func divergenceText(d *api.Divergence) string {
	return fmt.Sprintf("step %d (%s): logged %s, replayed %s", d.Step, d.Kind, d.Logged, d.Replayed)
}

func (a *app) trajRemoveCmd() *cobra.Command {
	return a.removeCmd("Delete trajectories, their steps and their blobs", (*client.Client).DeleteTrajectory)
}

func (a *app) trajExportCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export ID",
		Short: "Write every step as JSONL (one step a line, in order) to standard output or -o FILE",
		Long: `Write every step of the trajectory as JSONL, one step a line, in order, with
the audit events its sandbox raised during each. -o FILE is replaced only once
the export is complete.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				return c.ExportTrajectory(cmd.Context(), argv[0], cmd.OutOrStdout())
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(c.ExportTrajectory(cmd.Context(), argv[0], pw)) }()
			err = writeAtomic(out, pr)
			pr.CloseWithError(err) // ends the export if the file failed first
			if err != nil {
				return fmt.Errorf("exporting %s: %w", argv[0], err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of standard output")
	return cmd
}

func (a *app) trajResumeCmd() *cobra.Command {
	var (
		secretEnv    []string
		onDivergence string
		fromScratch  bool
		tier         string
	)
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Rebuild a rollout in a new sandbox by replaying its trajectory, and print the sandbox's ID",
		Long: `Create a sandbox from the trajectory's logged spec, starting from its latest
snapshot (unless --from-scratch), and replay the steps that changed state, in
order. The new sandbox's ID goes to standard output; what the replay did
(steps replayed and skipped, a divergence) to standard error. A replayed
step whose result differs from the log stops the replay there, keeping the
sandbox (--on-divergence stop, the default), or is reported and passed
(continue). Secret env values are not logged: give them again with
--secret-env KEY=VALUE, or KEY to take the value from this environment.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			secrets, err := parseSecretEnv(secretEnv, a.env.lookupEnv)
			if err != nil {
				return err
			}
			if onDivergence != "" && onDivergence != api.DivergenceStop && onDivergence != api.DivergenceContinue {
				return usagef("--on-divergence %q: want stop or continue", onDivergence)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Resume(cmd.Context(), argv[0], api.ResumeRequest{
				SecretEnv: secrets, OnDivergence: onDivergence, Tier: tier, FromScratch: fromScratch,
			})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			if _, err := fmt.Fprintln(cmd.OutOrStdout(), res.Sandbox.ID); err != nil {
				return err
			}
			msg := fmt.Sprintf("replayed %d steps, skipped %d", res.Replayed, res.Skipped)
			if res.From != "" {
				msg += " after snapshot " + res.From
			}
			fmt.Fprintln(cmd.ErrOrStderr(), msg)
			if res.Divergence != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "diverged at "+divergenceText(res.Divergence))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&secretEnv, "secret-env", nil, "value of a secret env variable of the create, KEY=VALUE or KEY (from this environment) (repeatable)")
	fs.StringVar(&onDivergence, "on-divergence", "", "stop (default: keep the sandbox where the replay diverged) or continue")
	fs.BoolVar(&fromScratch, "from-scratch", false, "ignore snapshots: replay from the create")
	fs.StringVar(&tier, "tier", "", "resume on this tier instead of the logged one")
	return cmd
}
