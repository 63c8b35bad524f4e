package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) sandboxRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Destroy sandboxes",
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range ids {
				if err := c.DeleteSandbox(cmd.Context(), id); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
					continue
				}
				if !a.json {
					fmt.Fprintln(cmd.OutOrStdout(), id)
				}
			}
			return errors.Join(errs...)
		},
	}
}
