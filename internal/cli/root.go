// Package cli implements dsec's client commands (sandbox, exec, run, files,
// image, layer, nodes, traj, snapshot, version) on top of package client.
// The daemon commands (up, server, node, token) live elsewhere and are
// added by cmd/dsec.
package cli

import (
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// Defaults of the global flags.
const (
	defaultURL     = "http://127.0.0.1:7878"
	defaultDataDir = "/var/lib/dsec"
)

// env is what the commands take from the process, so that tests can supply
// their own.
type env struct {
	lookupEnv  func(string) (string, bool)
	isTerminal func(io.Writer) bool
	now        func() time.Time
	// dataDir is where a local `dsec up` keeps its token, unless
	// DSEC_DATA_DIR says otherwise.
	dataDir string
}

func osEnv() env {
	return env{
		lookupEnv:  os.LookupEnv,
		isTerminal: isCharDevice,
		now:        time.Now,
		dataDir:    defaultDataDir,
	}
}

// isCharDevice reports whether w is a terminal (or another character
// device), where progress lines make sense.
func isCharDevice(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// app holds the global flags and the environment every command shares.
type app struct {
	env     env
	version string
	url     string
	token   string
	json    bool
	timeout time.Duration
}

// NewRoot returns the dsec command with the client commands, the global
// flags --url, --token, --json and --timeout, and extra (the daemon
// commands) added. Run it with Execute to get dsec's exit codes and error
// output.
func NewRoot(version string, extra ...*cobra.Command) *cobra.Command {
	return newRoot(osEnv(), version, extra...)
}

func newRoot(e env, version string, extra ...*cobra.Command) *cobra.Command {
	a := &app{env: e, version: version}
	root := &cobra.Command{
		Use:           "dsec",
		Short:         "DSec runs untrusted code in sandboxes of four tiers behind one API",
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{err}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.url, "url", "", "server URL (env DSEC_URL, default "+defaultURL+")")
	pf.StringVar(&a.token, "token", "", "API token (env DSEC_TOKEN, else $DSEC_DATA_DIR/token, else "+defaultDataDir+"/token)")
	pf.BoolVar(&a.json, "json", false, "print the API's JSON instead of human output")
	pf.DurationVar(&a.timeout, "timeout", 30*time.Second, "time limit of one API request (commands get their own run time on top)")
	root.AddCommand(
		a.sandboxCmd(),
		a.auditCmd(),
		a.execCmd(),
		a.runCmd(),
		a.filesCmd(),
		a.imageCmd(),
		a.layerCmd(),
		a.nodesCmd(),
		a.trajCmd(),
		a.snapshotCmd(),
		a.versionCmd(),
	)
	root.AddCommand(extra...)
	// `dsec node cordon|uncordon|drain NODE` beside the node role's own
	// command, as `dsec nodes cordon …` is.
	for _, c := range extra {
		if c.Name() == "node" {
			c.AddCommand(a.nodeAdminCmds()...)
		}
	}
	return root
}
