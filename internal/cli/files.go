package cli

import "github.com/spf13/cobra"

func (a *app) filesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "files",
		Short: "List, read, write and remove files in a sandbox",
	}
	cmd.AddCommand(
		a.filesListCmd(),
		a.filesCatCmd(),
		a.filesPutCmd(),
		a.filesGetCmd(),
		a.filesRemoveCmd(),
		a.filesMkdirCmd(),
	)
	return cmd
}
