package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) sandboxGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"inspect"},
		Short:   "Describe a sandbox",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			return a.describeSandbox(cmd.OutOrStdout(), sb)
		},
	}
}

func (a *app) describeSandbox(w io.Writer, sb *api.Sandbox) error {
	now := a.env.now()
	tw := newTable(w, "ID:", sb.ID)
	row(tw, "Tier:", sb.Tier)
	row(tw, "Image:", orDash(sb.Image))
	if sb.ImageID != "" {
		row(tw, "Image ID:", sb.ImageID)
	}
	row(tw, "State:", string(sb.State))
	if sb.Reason != "" {
		row(tw, "Reason:", sb.Reason)
	}
	row(tw, "Node:", orDash(sb.Node))
	row(tw, "Resources:", fmt.Sprintf("%g CPU, %d MB memory, %d MB disk", sb.CPU, sb.MemoryMB, sb.DiskMB))
	row(tw, "Labels:", formatLabels(sb.Labels))
	row(tw, "Created:", fmt.Sprintf("%s (%s ago)", sb.CreatedAt.Format(time.RFC3339), humanDuration(max(now.Sub(sb.CreatedAt), 0))))
	if sb.EndedAt != nil {
		row(tw, "Ended:", sb.EndedAt.Format(time.RFC3339))
	} else {
		row(tw, "Expires:", fmt.Sprintf("%s (in %s)", sb.ExpiresAt.Format(time.RFC3339), expiresIn(*sb, now)))
	}
	return tw.Flush()
}
