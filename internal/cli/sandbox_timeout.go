package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func (a *app) sandboxTimeoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "timeout ID SECONDS",
		Short: "Make a sandbox expire SECONDS from now",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			s, err := strconv.Atoi(argv[1])
			if err != nil || s <= 0 {
				return usagef("SECONDS %q: want a positive whole number", argv[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.SetTimeout(cmd.Context(), argv[0], time.Duration(s)*time.Second)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s expires at %s\n", sb.ID, sb.ExpiresAt.Format(time.RFC3339))
			return err
		},
	}
}
