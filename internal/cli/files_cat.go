package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

func (a *app) filesCatCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cat SANDBOX PATH",
		Short: "Print a file",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			rc, err := c.ReadFile(cmd.Context(), argv[0], argv[1])
			if err != nil {
				return err
			}
			defer rc.Close()
			if _, err := io.Copy(cmd.OutOrStdout(), rc); err != nil {
				return fmt.Errorf("reading %s: %w", argv[1], err)
			}
			return nil
		},
	}
}
