package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) layerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "layer",
		Aliases: []string{"layers"},
		Short:   "Build, list, inspect and remove layers",
	}
	cmd.AddCommand(a.layerBuildCmd(), a.layerListCmd(), a.layerInspectCmd(), a.layerRemoveCmd())
	return cmd
}

func (a *app) layerListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List layers",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListLayers(cmd.Context())
			if err != nil {
				return err
			}
			if l.Layers == nil {
				l.Layers = []api.Layer{}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			now := a.env.now()
			tw := newTable(cmd.OutOrStdout(), "ID", "NAMES", "META", "BLOB", "SOURCE", "BUILDER", "AGE")
			for _, ly := range l.Layers {
				row(tw, shortID(ly.ID), orDash(strings.Join(ly.Names, ",")), humanBytes(ly.MetaSize), humanBytes(ly.BlobSize),
					orDash(ly.SourceKind), orDash(ly.Builder), humanDuration(max(now.Sub(ly.CreatedAt), 0)))
			}
			return tw.Flush()
		},
	}
}

func (a *app) layerInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "inspect REF",
		Aliases: []string{"get"},
		Short:   "Print a layer as JSON (REF: name:version or ID)",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.GetLayer(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), l)
		},
	}
}

func (a *app) layerRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"delete"},
		Short:   "Remove layer names, or (given IDs) layers",
		Long: `Remove each REF: a name:version removes that name; a layer ID removes the
layer, its names and its blobs. A layer that an image or a live sandbox uses
is not removed (conflict).`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, refs []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, ref := range refs {
				if err := c.DeleteLayer(cmd.Context(), ref); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", ref, err))
					continue
				}
				if !a.json {
					fmt.Fprintln(cmd.OutOrStdout(), ref)
				}
			}
			return errors.Join(errs...)
		},
	}
}
