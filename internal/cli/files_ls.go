package cli

import (
	"io"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) filesListCmd() *cobra.Command {
	var depth int
	cmd := &cobra.Command{
		Use:   "ls SANDBOX PATH",
		Short: "List a directory",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListFiles(cmd.Context(), argv[0], argv[1], depth)
			if err != nil {
				return err
			}
			if l.Entries == nil {
				l.Entries = []api.FileInfo{}
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			return printFiles(cmd.OutOrStdout(), l.Entries, depth > 1)
		},
	}
	cmd.Flags().IntVar(&depth, "depth", 0, "levels to descend (default 1)")
	return cmd
}

// printFiles prints entries as a table, by full path if deep.
func printFiles(w io.Writer, entries []api.FileInfo, deep bool) error {
	tw := newTable(w, "MODE", "SIZE", "MODIFIED", "NAME")
	for _, e := range entries {
		name := e.Name
		if deep {
			name = e.Path
		}
		if e.Type == api.FileTypeDir {
			name += "/"
		}
		if e.Target != "" {
			name += " -> " + e.Target
		}
		row(tw, fileMode(e), strconv.FormatInt(e.Size, 10), e.ModTime.Local().Format(time.DateTime), name)
	}
	return tw.Flush()
}

// fileMode renders type and permissions as ls -l does: drwxr-xr-x.
func fileMode(e api.FileInfo) string {
	m := os.FileMode(e.Mode).Perm()
	switch e.Type {
	case api.FileTypeDir:
		m |= os.ModeDir
	case api.FileTypeSymlink:
		m |= os.ModeSymlink
	case api.FileTypeOther:
		m |= os.ModeIrregular
	}
	return m.String()
}
