package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func (a *app) nodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "nodes",
		Aliases: []string{"node-ls"},
		Short:   "List nodes, the tiers they run and their load",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if l.Nodes == nil {
				l.Nodes = []api.Node{}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			tw := newTable(cmd.OutOrStdout(), "ID", "READY", "TIERS", "SANDBOXES/MAX", "PLACING")
			for _, n := range l.Nodes {
				ready := "no"
				if n.Ready {
					ready = "yes"
				}
				row(tw, n.ID, ready, formatTiers(n.Tiers), fmt.Sprintf("%d/%d", n.Usage.Sandboxes, n.Capacity.MaxSandboxes), placing(n))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(a.nodeAdminCmds()...)
	return cmd
}

// placing says whether sandboxes are placed on n: "yes", "cordoned" or
// "draining until <deadline>".
func placing(n api.Node) string {
	switch {
	case n.Draining && n.DrainDeadline != nil:
		return "draining until " + n.DrainDeadline.Local().Format(time.DateTime)
	case n.Draining:
		return "draining"
	case n.Cordoned:
		return "cordoned"
	}
	return "yes"
}

// nodeAdminCmds are cordon, uncordon and drain NODE.
func (a *app) nodeAdminCmds() []*cobra.Command {
	act := func(use, short string, do func(cmd *cobra.Command, c *client.Client, node string) (*api.Node, error)) *cobra.Command {
		return &cobra.Command{
			Use:   use + " NODE",
			Short: short,
			Args:  args(cobra.ExactArgs(1)),
			RunE: func(cmd *cobra.Command, argv []string) error {
				c, err := a.client()
				if err != nil {
					return err
				}
				n, err := do(cmd, c, argv[0])
				if err != nil {
					return err
				}
				if a.json {
					return printJSON(cmd.OutOrStdout(), n)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: placing %s\n", n.ID, placing(*n))
				return err
			},
		}
	}
	cordon := act("cordon", "Place no new sandbox on a node (its sandboxes run on)", func(cmd *cobra.Command, c *client.Client, node string) (*api.Node, error) {
		return c.CordonNode(cmd.Context(), node)
	})
	uncordon := act("uncordon", "Place sandboxes on a node again (ends a drain)", func(cmd *cobra.Command, c *client.Client, node string) (*api.Node, error) {
		return c.UncordonNode(cmd.Context(), node)
	})
	var deadline time.Duration
	drain := act("drain", "Cordon a node and move its sandboxes off: resume those recorded with --resume-on-preempt elsewhere, destroy the rest at the deadline", func(cmd *cobra.Command, c *client.Client, node string) (*api.Node, error) {
		return c.DrainNode(cmd.Context(), node, api.DrainRequest{DeadlineS: int(deadline.Seconds())})
	})
	drain.Flags().DurationVar(&deadline, "deadline", time.Hour, "how long sandboxes that cannot be resumed elsewhere may run on")
	return []*cobra.Command{cordon, uncordon, drain}
}

// formatTiers lists the available tiers with their accelerator where one
// is involved: "function,container,microvm(kvm),vm(tcg)".
func formatTiers(tiers []api.TierInfo) string {
	var names []string
	for _, t := range tiers {
		if !t.Available {
			continue
		}
		name := t.Name
		if t.Accelerator != "" && t.Accelerator != "none" {
			name += "(" + t.Accelerator + ")"
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ",")
}
