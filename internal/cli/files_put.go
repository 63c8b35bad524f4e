package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func (a *app) filesPutCmd() *cobra.Command {
	var parents bool
	cmd := &cobra.Command{
		Use:   "put SANDBOX LOCAL REMOTE",
		Short: "Upload a file (LOCAL - reads standard input)",
		Long: `Upload LOCAL to REMOTE in the sandbox, streamed, keeping LOCAL's permission
bits. On a terminal a progress line shows the bytes sent and the rate.`,
		Args: args(cobra.ExactArgs(3)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, local, remote := argv[0], argv[1], argv[2]
			var (
				r     io.Reader = cmd.InOrStdin()
				total int64     = -1
				mode  os.FileMode
			)
			if local != "-" {
				f, err := os.Open(local)
				if err != nil {
					return err
				}
				defer f.Close()
				fi, err := f.Stat()
				if err != nil {
					return err
				}
				if fi.IsDir() {
					return fmt.Errorf("%s is a directory", local)
				}
				r, mode = f, fi.Mode().Perm()
				if fi.Mode().IsRegular() && fi.Size() > 0 {
					total = fi.Size()
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p := a.newProgress(cmd.ErrOrStderr(), remote, total)
			body := io.Reader(progressReader{r, p})
			if total >= 0 {
				body = sizedProgressReader{progressReader{r, p}}
			}
			fi, err := c.WriteFile(cmd.Context(), id, remote, body, client.WriteOptions{Mode: mode, Parents: parents})
			if err != nil {
				return err
			}
			p.done()
			if a.json {
				return printJSON(cmd.OutOrStdout(), fi)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", true, "make missing parent directories of REMOTE (--parents=false to refuse)")
	return cmd
}
