package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes besides a command's own.
const (
	exitError    = 1   // the API or the CLI failed
	exitUsage    = 2   // bad flags or arguments
	exitTimedOut = 124 // the command ran out of time, as timeout(1) says
	exitSignal   = 130 // interrupted
)

// ExitError makes Execute return Code without printing anything; dsec exec
// and dsec run use it to pass on the command's exit code.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// usageError is an error in the command line rather than in what it asked.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// Execute runs root with ctx and returns the process's exit code: 0, the
// code of an *ExitError, 2 for a bad command line, 1 for any other error.
// Errors are printed to root's error output as "dsec: <message>", which
// for API errors reads "dsec: <message> (<code>)".
func Execute(ctx context.Context, root *cobra.Command) int {
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	w := root.ErrOrStderr()
	fmt.Fprintf(w, "dsec: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(w, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitError
}

// isCobraUsage recognises the one usage error cobra returns untyped.
func isCobraUsage(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command ")
}

// args wraps cobra's argument validators so that their errors count as
// usage errors.
func args(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := v(cmd, a); err != nil {
			return usageError{err}
		}
		return nil
	}
}
