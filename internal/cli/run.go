package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

const (
	// runGrace is how much longer than its command a `dsec run` sandbox
	// lives, should the CLI die before deleting it.
	runGrace = 30
	// deleteTimeout bounds the deletion of a `dsec run` sandbox.
	deleteTimeout = 30 * time.Second
)

func (a *app) runCmd() *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "run --tier T [flags] -- CMD [ARG...]",
		Short: "Run a command in a fresh sandbox that is deleted afterwards",
		Long: `Create a sandbox, run a command in it with its output streamed, and delete
the sandbox, also when the command fails or dsec is interrupted. dsec exits
with the command's exit code (124 if it timed out, 1 if the API failed).`,
		Args: cobra.ArbitraryArgs, // splitCommand checks them
		RunE: func(cmd *cobra.Command, argv []string) error {
			_, command, err := splitCommand(cmd, argv, 0)
			if err != nil {
				return err
			}
			if f.tier == "" {
				return usagef("--tier is required")
			}
			req, err := f.request(a.env.lookupEnv)
			if err != nil {
				return err
			}
			ereq := commandRequest(command)
			if f.timeoutS > 0 {
				ereq.TimeoutS = float64(f.timeoutS)
				req.TimeoutS = f.timeoutS + runGrace
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Create even if interrupted meanwhile: a sandbox the server made
			// but this process never heard of could not be deleted.
			sb, err := c.CreateSandbox(context.WithoutCancel(ctx), req)
			if err != nil {
				return err
			}
			defer func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
				defer cancel()
				if err := c.DeleteSandbox(dctx, sb.ID); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "dsec: deleting sandbox %s: %v\n", sb.ID, err)
				}
			}()
			if ctx.Err() != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "dsec: interrupted")
				return &ExitError{Code: exitSignal}
			}
			return a.streamExec(ctx, cmd, c, sb.ID, ereq)
		},
	}
	f.register(cmd.Flags(), "time limit of the command in seconds (default 60)")
	return cmd
}
