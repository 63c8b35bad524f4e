package cli

import (
	"errors"
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
		Short:   "Compose, list, tag and remove images",
	}
	cmd.AddCommand(
		a.imageCreateCmd(),
		a.imageListCmd(),
		a.imageInspectCmd(),
		a.imageRemoveCmd(),
		a.imageTagCmd(),
		a.imageAddDirCmd(),
	)
	return cmd
}

func (a *app) imageListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images, one line per name",
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
			tw := newTable(cmd.OutOrStdout(), "NAME", "ID", "LAYERS", "TIERS", "SOURCE", "AGE")
			for _, img := range l.Images {
				tiers := "any"
				if len(img.Tiers) > 0 {
					tiers = strings.Join(img.Tiers, ",")
				}
				roles := make([]string, len(img.Layers))
				for i, ly := range img.Layers {
					roles[i] = ly.Role
				}
				row(tw, orDash(img.Name), shortID(img.ID), orDash(strings.Join(roles, ",")), tiers, orDash(img.Source),
					humanDuration(max(now.Sub(img.CreatedAt), 0)))
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

func (a *app) imageCreateCmd() *cobra.Command {
	var (
		base, workspace, toolkit string
		layers, tiers            []string
	)
	cmd := &cobra.Command{
		Use:   "create NAME:TAG [--base REF] [--workspace REF] [--toolkit REF] [--layer ROLE=REF]...",
		Short: "Compose an image from layers and name it",
		Long: `Compose an image from layers (each a name:version or layer ID) and name it
NAME:TAG; print its ID. The layers are, bottom first: --base, --workspace,
--toolkit, then each --layer ROLE=REF in the order given. --base may also
name an image (e.g. debian-12): its layers are the new image's bottom ones.
An image the container tier may run (no --tier, or --tier container) needs
the in-sandbox agent: if none of its layers has it, the server adds its
toolkit/dsec-guest layer on top (give --tier for images meant only for other
tiers). The tag moves if it named another image; image IDs never change.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			extra, err := parseLayers(layers)
			if err != nil {
				return err
			}
			req := api.CreateImageRequest{Name: argv[0], Tiers: tiers}
			if len(extra) == 0 {
				req.Base, req.Workspace, req.Toolkit = base, workspace, toolkit
			} else {
				// The API takes the shorthand or a list, not both.
				for _, l := range []api.ImageLayer{{Role: "base", ID: base}, {Role: "workspace", ID: workspace}, {Role: "toolkit", ID: toolkit}} {
					if l.ID != "" {
						req.Layers = append(req.Layers, l)
					}
				}
				req.Layers = append(req.Layers, extra...)
			}
			if req.Base == "" && req.Workspace == "" && req.Toolkit == "" && len(req.Layers) == 0 {
				return usagef("no layers: give --base, --workspace, --toolkit or --layer")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.CreateImage(cmd.Context(), req)
			if err != nil {
				return err
			}
			return a.printImage(cmd, img)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&base, "base", "", "base layer (e.g. base/debian-12:VERSION), or an image whose layers to build on (e.g. debian-12)")
	fs.StringVar(&workspace, "workspace", "", "workspace layer")
	fs.StringVar(&toolkit, "toolkit", "", "toolkit layer (e.g. toolkit/wasm-tools:VERSION)")
	fs.StringArrayVar(&layers, "layer", nil, "another layer ROLE=REF, above the others (repeatable)")
	fs.StringArrayVar(&tiers, "tier", nil, "tier the image is meant for (repeatable; default any)")
	return cmd
}

func (a *app) printImage(cmd *cobra.Command, img *api.Image) error {
	if a.json {
		return printJSON(cmd.OutOrStdout(), img)
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), img.ID)
	return err
}

func (a *app) imageInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "inspect REF",
		Aliases: []string{"get"},
		Short:   "Print an image as JSON (REF: name[:tag] or ID)",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.GetImage(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), img)
		},
	}
}

func (a *app) imageTagCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "tag REF NAME:TAG",
		Short: "Point NAME:TAG at the image REF and print the image's ID",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.TagImage(cmd.Context(), argv[0], argv[1])
			if err != nil {
				return err
			}
			return a.printImage(cmd, img)
		},
	}
}

func (a *app) imageRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"delete"},
		Short:   "Remove image names, or (given IDs) images",
		Long: `Remove each REF: a name[:tag] removes that name; an image ID removes the
image and all its names. An image a live sandbox uses is not removed
(conflict).`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, refs []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, ref := range refs {
				if err := c.DeleteImage(cmd.Context(), ref); err != nil {
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
			return a.printImage(cmd, img)
		},
	}
	cmd.Flags().StringArrayVar(&tiers, "tier", nil, "tier the image is meant for (repeatable; default any)")
	return cmd
}
