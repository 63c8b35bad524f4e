package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) nodesCmd() *cobra.Command {
	return &cobra.Command{
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
			tw := newTable(cmd.OutOrStdout(), "ID", "READY", "TIERS", "SANDBOXES/MAX")
			for _, n := range l.Nodes {
				ready := "no"
				if n.Ready {
					ready = "yes"
				}
				row(tw, n.ID, ready, formatTiers(n.Tiers), fmt.Sprintf("%d/%d", n.Usage.Sandboxes, n.Capacity.MaxSandboxes))
			}
			return tw.Flush()
		},
	}
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
