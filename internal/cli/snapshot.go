package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func (a *app) snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snap"},
		Short:   "Inspect and delete snapshots (take one with `dsec sandbox snapshot`)",
	}
	cmd.AddCommand(a.snapshotGetCmd(), a.snapshotRemoveCmd())
	return cmd
}

func (a *app) snapshotGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"inspect"},
		Short:   "Describe a snapshot",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			return describeSnapshot(cmd.OutOrStdout(), s)
		},
	}
}

func describeSnapshot(w io.Writer, s api.Snapshot) error {
	tw := newTable(w, "ID:", s.ID)
	row(tw, "Sandbox:", orDash(s.Sandbox))
	row(tw, "Tier:", orDash(s.Tier))
	if s.Trajectory != "" {
		row(tw, "Trajectory:", fmt.Sprintf("%s at step %d", s.Trajectory, s.Step))
	}
	row(tw, "Layers:", orDash(strings.Join(s.Layers, ", ")))
	row(tw, "Stored:", humanBytes(s.Bytes))
	row(tw, "Created:", s.CreatedAt.Format(time.RFC3339))
	return tw.Flush()
}

func (a *app) snapshotRemoveCmd() *cobra.Command {
	return a.removeCmd("Delete snapshots (their layers stay while a sandbox or trajectory uses them)", (*client.Client).DeleteSnapshot)
}

func (a *app) sandboxSnapshotCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot ID",
		Short: "Store a sandbox's writable state as a snapshot and print its ID (the sandbox keeps running)",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.Snapshot(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			return err
		},
	}
}

func (a *app) sandboxForkCmd() *cobra.Command {
	var (
		count    int
		timeoutS int
		labels   []string
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Start N sandboxes from a sandbox's current state and print their IDs, one a line",
		Long: `Start N sandboxes from the sandbox's current state, through one snapshot (its
ID goes to standard error). The parent keeps running. All or nothing: if one
child cannot be made, none is kept.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			lm, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			if timeoutS < 0 {
				return usagef("--timeout must not be negative")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), argv[0], api.ForkRequest{Count: count, TimeoutS: timeoutS, Labels: lm})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			for _, sb := range res.Sandboxes {
				if _, err := fmt.Fprintln(cmd.OutOrStdout(), sb.ID); err != nil {
					return err
				}
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "snapshot "+res.Snapshot.ID+", "+strconv.Itoa(len(res.Sandboxes))+" sandboxes")
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVarP(&count, "count", "n", 1, "number of sandboxes to start")
	fs.IntVar(&timeoutS, "timeout", 0, "each child's time to live in seconds (default the parent's)")
	fs.StringArrayVar(&labels, "label", nil, "each child's label K=V, instead of the parent's (repeatable)")
	return cmd
}
