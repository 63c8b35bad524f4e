package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) sandboxCreateCmd() *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its ID",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request(a.env.lookupEnv)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return err
		},
	}
	f.register(cmd.Flags(), "time to live in seconds (default 300)")
	return cmd
}
