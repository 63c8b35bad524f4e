package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func (a *app) sandboxRemoveCmd() *cobra.Command {
	return a.removeCmd("Destroy sandboxes", (*client.Client).DeleteSandbox)
}

// removeCmd is an "rm ID..." command: del for each ID, each one printed
// once gone, every failure reported.
func (a *app) removeCmd(short string, del func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   short,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range ids {
				if err := del(c, cmd.Context(), id); err != nil {
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
