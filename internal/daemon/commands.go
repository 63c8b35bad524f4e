package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
)

// Commands returns the daemon commands of the dsec CLI: up, server, node
// and token.
func Commands(build Build) []*cobra.Command {
	return []*cobra.Command{
		roleCommand(RoleUp, build, "up", "Run DSec on this host: NATS, API server, scheduler and node service in one process"),
		roleCommand(RoleServer, build, "server", "Run the API server and control plane, joined to nodes through NATS"),
		roleCommand(RoleNode, build, "node", "Run a node service, joined to the control plane through NATS"),
		tokenCommand(),
	}
}

// flagBinding applies set flags over the configuration.
type flagBinding struct {
	configPath                           string
	dataDir, listen, natsURL, natsToken  string
	natsListen, nodeID, logLevel, logFmt string
	keep                                 bool
	hollow                               int
	serverName, clusterName              string
	clusterListen, routes                string
}

func roleCommand(role Role, build Build, use, short string) *cobra.Command {
	var fb flagBinding
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := fb.load(cmd)
			if err != nil {
				return err
			}
			log, err := newLogger(cfg, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return Run(ctx, role, cfg, build, log, func(info Info) { printReady(cmd.OutOrStdout(), role, info) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&fb.configPath, "config", "", "config file (TOML, version = 1); default /etc/dsec/config.toml if present [DSEC_CONFIG]")
	f.StringVar(&fb.dataDir, "data-dir", "", "data directory (default /var/lib/dsec) [DSEC_DATA_DIR]")
	f.StringVar(&fb.logLevel, "log-level", "", "debug, info, warn or error [DSEC_LOG_LEVEL]")
	f.StringVar(&fb.logFmt, "log-format", "", "text or json [DSEC_LOG_FORMAT]")
	if role != RoleNode {
		f.StringVar(&fb.listen, "listen", "", "API address (default 127.0.0.1:7878; port 0 picks one) [DSEC_LISTEN]")
	}
	if role == RoleUp {
		f.StringVar(&fb.natsListen, "nats-listen", "", "address the embedded NATS server accepts nodes on, or none (default 127.0.0.1:7422) [DSEC_NATS_LISTEN]")
		f.BoolVar(&fb.keep, "keep-sandboxes", false, "leave sandboxes running at shutdown; they are re-adopted at the next start [DSEC_KEEP_SANDBOXES]")
	} else {
		f.StringVar(&fb.natsURL, "nats-url", "", "NATS server URLs, comma-separated [DSEC_NATS_URL]")
	}
	if role == RoleServer {
		f.StringVar(&fb.natsListen, "nats-listen", "", "with --cluster-name: address the embedded NATS server accepts nodes on (default 127.0.0.1:7422) [DSEC_NATS_LISTEN]")
		f.StringVar(&fb.clusterName, "cluster-name", "", "run an embedded NATS server that joins this cluster, instead of dialling --nats-url [DSEC_CLUSTER_NAME]")
		f.StringVar(&fb.clusterListen, "cluster-listen", "", "host:port the other cluster members route to [DSEC_CLUSTER_LISTEN]")
		f.StringVar(&fb.routes, "routes", "", "the other cluster members' route addresses, comma-separated host:port [DSEC_ROUTES]")
	}
	if role != RoleNode {
		f.StringVar(&fb.serverName, "server-name", "", "this server's name, unique among the servers (default: the host name) [DSEC_SERVER_NAME]")
	}
	f.StringVar(&fb.natsToken, "nats-token", "", "NATS token [DSEC_NATS_TOKEN]")
	if role != RoleServer {
		f.StringVar(&fb.nodeID, "node-id", "", "node ID (default: the host name) [DSEC_NODE_ID]")
	}
	if role == RoleNode {
		f.BoolVar(&fb.keep, "keep-sandboxes", false, "leave sandboxes running at shutdown [DSEC_KEEP_SANDBOXES]")
		f.IntVar(&fb.hollow, "hollow", 0, "run this many simulated nodes (<node-id>-h0001 …) that make no OS objects, instead of a real node")
	}
	return cmd
}

// load builds the configuration: defaults, then the file, then DSEC_*
// variables, then flags that were set.
func (fb *flagBinding) load(cmd *cobra.Command) (config.Config, error) {
	cfg := config.Defaults()
	path, required := "/etc/dsec/config.toml", false
	if v := os.Getenv("DSEC_CONFIG"); v != "" {
		path, required = v, true
	}
	if fb.configPath != "" {
		path, required = fb.configPath, true
	}
	if err := cfg.Load(path, required); err != nil {
		return cfg, err
	}
	if err := cfg.ApplyEnv(os.Getenv); err != nil {
		return cfg, err
	}
	set := func(name string, dst *string, v string) {
		if cmd.Flags().Changed(name) {
			*dst = v
		}
	}
	set("data-dir", &cfg.DataDir, fb.dataDir)
	set("listen", &cfg.API.Listen, fb.listen)
	set("nats-url", &cfg.NATS.URL, fb.natsURL)
	set("nats-listen", &cfg.NATS.Listen, fb.natsListen)
	set("nats-token", &cfg.NATS.Token, fb.natsToken)
	set("node-id", &cfg.Node.ID, fb.nodeID)
	set("server-name", &cfg.NATS.ServerName, fb.serverName)
	set("cluster-name", &cfg.NATS.ClusterName, fb.clusterName)
	set("cluster-listen", &cfg.NATS.ClusterListen, fb.clusterListen)
	if cmd.Flags().Changed("routes") {
		cfg.NATS.Routes = config.SplitList(fb.routes)
	}
	set("log-level", &cfg.LogLevel, fb.logLevel)
	set("log-format", &cfg.LogFormat, fb.logFmt)
	if cmd.Flags().Changed("keep-sandboxes") {
		cfg.KeepSandboxes = fb.keep
	}
	if cmd.Flags().Changed("hollow") {
		cfg.Node.Hollow = fb.hollow
	}
	return cfg, cfg.Validate()
}

func newLogger(cfg config.Config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", cfg.LogLevel, err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func printReady(w io.Writer, role Role, info Info) {
	var b strings.Builder
	b.WriteString([...]string{"DSec is up.\n", "DSec server is up.\n", "DSec node is up.\n"}[role])
	if info.APIURL != "" {
		fmt.Fprintf(&b, "  API:    %s\n", info.APIURL)
		note := "`dsec token` prints it"
		if info.TokenCreated {
			note = "created now; `dsec token` prints it"
		}
		fmt.Fprintf(&b, "  Token:  %s (%s)\n", info.TokenFile, note)
	}
	if info.NATSURL != "" {
		fmt.Fprintf(&b, "  NATS:   %s\n", info.NATSURL)
	}
	if info.NodeID != "" {
		fmt.Fprintf(&b, "  Node:   %s\n", info.NodeID)
	}
	fmt.Fprint(w, b.String())
}

func tokenCommand() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Print the API token of the local DSec (created by dsec up)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := dataDir
			if dir == "" {
				dir = os.Getenv("DSEC_DATA_DIR")
			}
			if dir == "" {
				dir = config.Defaults().DataDir
			}
			tok, err := auth.Load(dir)
			if err != nil {
				return fmt.Errorf("reading the token in %s (has `dsec up` run there?): %w", dir, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "data directory (default /var/lib/dsec) [DSEC_DATA_DIR]")
	return cmd
}
