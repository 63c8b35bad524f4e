package cli

import (
	"github.com/spf13/cobra"
)

func (a *app) filesRemoveCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm [-r] SANDBOX PATH",
		Short: "Remove a file or directory",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.RemoveFile(cmd.Context(), argv[0], argv[1], recursive)
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and its content")
	return cmd
}
