package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
)

// versions is the --json output of dsec version.
type versions struct {
	Client string `json:"client"`
	// Server is null when the server could not be reached.
	Server *api.VersionInfo `json:"server"`
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and, if reachable, the server's version",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versions{Client: a.version}
			var serverErr error
			c, err := a.client()
			if err == nil {
				v.Server, serverErr = c.Version(cmd.Context())
			} else {
				serverErr = err
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "client: %s\n", a.version)
			if v.Server == nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "server: unreachable: %v\n", serverErr)
				return nil
			}
			s := v.Server
			_, err = fmt.Fprintf(w, "server: %s (API %s, %s)\n", s.Version, s.API, s.GoVersion)
			return err
		},
	}
}
