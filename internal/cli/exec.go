package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func (a *app) execCmd() *cobra.Command {
	var (
		env      []string
		cwd      string
		timeoutS float64
		stdin    bool
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] SANDBOX -- CMD [ARG...]",
		Short: "Run a command in a sandbox, streaming its output",
		Long: `Run a command in a sandbox and stream its standard output and error as it
runs. dsec exits with the command's exit code, 124 if it timed out, and 1 if
the API failed. A single CMD that contains a space is run as a command line
(by /bin/sh -c where the tier has a shell).`,
		Args: cobra.ArbitraryArgs, // splitCommand checks them
		RunE: func(cmd *cobra.Command, argv []string) error {
			before, command, err := splitCommand(cmd, argv, 1)
			if err != nil {
				return err
			}
			envm, err := parseKV("env", env)
			if err != nil {
				return err
			}
			req := commandRequest(command)
			req.Env, req.Cwd, req.TimeoutS = envm, cwd, timeoutS
			if stdin {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("reading stdin: %w", err)
				}
				req.Stdin = string(b)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.streamExec(ctx, cmd, c, before[0], req)
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&env, "env", nil, "environment variable K=V (repeatable)")
	fs.StringVar(&cwd, "cwd", "", "working directory in the sandbox: absolute, or relative to /workspace (the default)")
	fs.Float64Var(&timeoutS, "timeout", 0, "time limit of the command in seconds (default 60)")
	fs.BoolVar(&stdin, "stdin", false, "send dsec's standard input to the command")
	return cmd
}

// splitCommand splits argv into the n arguments before the command and
// the command, which follows "--" (or, without one, the n arguments).
func splitCommand(cmd *cobra.Command, argv []string, n int) (before, command []string, err error) {
	at := cmd.ArgsLenAtDash()
	if at == -1 {
		at = min(n, len(argv))
	}
	if at != n {
		return nil, nil, usagef("want %d argument(s) before the command, got %d", n, at)
	}
	if at == len(argv) {
		return nil, nil, usagef("no command given (put it after --)")
	}
	return argv[:at], argv[at:], nil
}

// commandRequest runs one argument with a space in it as a command line
// and anything else as an argv.
func commandRequest(command []string) api.ExecRequest {
	if len(command) == 1 && strings.ContainsAny(command[0], " \t\n") {
		return api.ExecRequest{Command: command[0]}
	}
	return api.ExecRequest{Cmd: command}
}

// streamExec runs req in sandbox id, copies its output to the command's
// stdout and stderr as it comes (or prints the events with --json), and
// returns an *ExitError carrying the command's exit status unless it is 0.
func (a *app) streamExec(ctx context.Context, cmd *cobra.Command, c *client.Client, id string, req api.ExecRequest) error {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	handle := func(ev api.ExecEvent) error {
		var err error
		switch ev.Type {
		case api.EventStdout:
			_, err = io.WriteString(stdout, ev.Data)
		case api.EventStderr:
			_, err = io.WriteString(stderr, ev.Data)
		}
		return err
	}
	if a.json {
		enc := json.NewEncoder(stdout)
		handle = func(ev api.ExecEvent) error { return enc.Encode(ev) }
	}
	res, err := c.ExecStream(ctx, id, req, handle)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			fmt.Fprintln(stderr, "dsec: interrupted")
			return &ExitError{Code: exitSignal}
		}
		return err
	}
	if !a.json {
		if res.StdoutTruncated || res.StderrTruncated {
			fmt.Fprintln(stderr, "dsec: output was truncated at the server's limit")
		}
		switch {
		case res.TimedOut:
			fmt.Fprintln(stderr, "dsec: command timed out")
		case res.ExitCode < 0:
			fmt.Fprintf(stderr, "dsec: command ended without an exit status: %s\n", orDash(res.Error))
		}
	}
	switch {
	case res.TimedOut:
		return &ExitError{Code: exitTimedOut}
	case res.ExitCode < 0:
		return &ExitError{Code: exitError}
	case res.ExitCode != 0:
		return &ExitError{Code: res.ExitCode}
	}
	return nil
}
