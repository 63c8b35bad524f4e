package cli

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/spf13/cobra"
)

func (a *app) filesGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get SANDBOX REMOTE LOCAL",
		Short: "Download a file (LOCAL - writes standard output)",
		Long: `Download REMOTE from the sandbox to LOCAL, streamed; LOCAL is replaced only
once the download is complete. On a terminal a progress line shows the bytes
received and the rate.`,
		Args: args(cobra.ExactArgs(3)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, remote, local := argv[0], argv[1], argv[2]
			c, err := a.client()
			if err != nil {
				return err
			}
			p := a.newProgress(cmd.ErrOrStderr(), remote, -1)
			if p.w != nil { // the total only matters to the progress line
				if fi, err := c.StatFile(cmd.Context(), id, remote); err == nil {
					p.total = fi.Size
				}
			}
			rc, err := c.ReadFile(cmd.Context(), id, remote)
			if err != nil {
				return err
			}
			defer rc.Close()
			r := progressReader{rc, p}
			if local == "-" {
				if _, err := io.Copy(cmd.OutOrStdout(), r); err != nil {
					return fmt.Errorf("downloading %s: %w", remote, err)
				}
				p.done()
				return nil
			}
			if fi, err := os.Stat(local); err == nil && fi.IsDir() {
				local = filepath.Join(local, path.Base(remote))
			}
			if err := writeAtomic(local, r); err != nil {
				return fmt.Errorf("downloading %s: %w", remote, err)
			}
			p.done()
			return nil
		},
	}
}

// writeAtomic copies r into a new file that then replaces name.
func writeAtomic(name string, r io.Reader) (err error) {
	f, err := os.CreateTemp(filepath.Dir(name), ".dsec-get-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}
