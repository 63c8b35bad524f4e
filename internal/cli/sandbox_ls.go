package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func (a *app) sandboxListCmd() *cobra.Command {
	var (
		labels []string
		state  string
		tier   string
		all    bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes, newest first",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lm, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			opts := client.ListOptions{Labels: lm, State: api.State(state), Tier: tier}
			var l *api.SandboxList
			if all {
				sbs, err := c.ListAllSandboxes(cmd.Context(), opts)
				if err != nil {
					return err
				}
				l = &api.SandboxList{Sandboxes: sbs}
			} else if l, err = c.ListSandboxes(cmd.Context(), opts); err != nil {
				return err
			}
			if l.Sandboxes == nil {
				l.Sandboxes = []api.Sandbox{}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			if err := a.printSandboxes(cmd.OutOrStdout(), l.Sandboxes); err != nil {
				return err
			}
			if l.NextPageToken != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "(more sandboxes: list them all with --all)")
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&labels, "label", nil, "only sandboxes with label K=V (repeatable)")
	fs.StringVar(&state, "state", "", "only sandboxes in this state: pending, running, stopping, stopped or failed")
	fs.StringVar(&tier, "tier", "", "only sandboxes of this tier")
	fs.BoolVar(&all, "all", false, "list every page, not just the first")
	return cmd
}

func (a *app) printSandboxes(w io.Writer, sbs []api.Sandbox) error {
	now := a.env.now()
	tw := newTable(w, "ID", "TIER", "IMAGE", "STATE", "AGE", "EXPIRES IN", "LABELS")
	for _, sb := range sbs {
		row(tw, sb.ID, sb.Tier, orDash(sb.Image), string(sb.State),
			humanDuration(max(now.Sub(sb.CreatedAt), 0)), expiresIn(sb, now), formatLabels(sb.Labels))
	}
	return tw.Flush()
}

// expiresIn is the time a live sandbox has left, or "-".
func expiresIn(sb api.Sandbox, now time.Time) string {
	if sb.State == api.StateStopped || sb.State == api.StateFailed || sb.ExpiresAt.IsZero() {
		return "-"
	}
	return humanDuration(max(sb.ExpiresAt.Sub(now), 0))
}
