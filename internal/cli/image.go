package cli

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) imageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "List and register images",
	}
	cmd.AddCommand(a.imageListCmd(), a.imageAddDirCmd())
	return cmd
}

func (a *app) imageListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.Images(cmd.Context())
			if err != nil {
				return err
			}
			if l.Images == nil {
				l.Images = []api.Image{}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			now := a.env.now()
			tw := newTable(cmd.OutOrStdout(), "ID", "NAME", "TIERS", "SOURCE", "CREATED")
			for _, img := range l.Images {
				tiers := "any"
				if len(img.Tiers) > 0 {
					tiers = strings.Join(img.Tiers, ",")
				}
				row(tw, shortID(img.ID), img.Name, tiers, orDash(img.Source), humanDuration(max(now.Sub(img.CreatedAt), 0))+" ago")
			}
			return tw.Flush()
		},
	}
}

// shortID shortens a content digest for tables.
func shortID(id string) string {
	if _, hex, ok := strings.Cut(id, ":"); ok && len(hex) > 12 {
		return hex[:12]
	}
	return id
}

func (a *app) imageAddDirCmd() *cobra.Command {
	var tiers []string
	cmd := &cobra.Command{
		Use:   "add-dir NAME PATH",
		Short: "Register a directory on the server host as an image",
		Long: `Register a directory on the server's host as an image. PATH is made absolute
here, so it must name the directory as the server sees it (on one host, the
same path). The server reads it and never writes to it.`,
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			path, err := filepath.Abs(argv[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.AddDirImage(cmd.Context(), api.AddDirImageRequest{Name: argv[0], Path: path, Tiers: tiers})
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), img)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), img.ID)
			return err
		},
	}
	cmd.Flags().StringArrayVar(&tiers, "tier", nil, "tier the image is meant for (repeatable; default any)")
	return cmd
}
