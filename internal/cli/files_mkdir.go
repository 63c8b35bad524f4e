package cli

import (
	"github.com/spf13/cobra"
)

func (a *app) filesMkdirCmd() *cobra.Command {
	var parents bool
	cmd := &cobra.Command{
		Use:   "mkdir [-p] SANDBOX PATH",
		Short: "Make a directory",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			fi, err := c.Mkdir(cmd.Context(), argv[0], argv[1], parents)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), fi)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "make missing parent directories too")
	return cmd
}
