package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) sandboxPhaseCmd() *cobra.Command {
	var back bool
	cmd := &cobra.Command{
		Use:   "phase ID PHASE",
		Short: "Move a sandbox to another of its phases (every process of the current one ends)",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.SetPhase(cmd.Context(), argv[0], argv[1], back)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s is in phase %s\n", sb.ID, sb.Phase)
			return err
		},
	}
	cmd.Flags().BoolVar(&back, "back", false, "allow moving to an earlier phase")
	return cmd
}
