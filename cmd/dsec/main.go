// Command dsec is DSec's one binary: the daemon roles (up, server, node)
// and the client commands.
package main

import (
	"context"
	"os"

	"github.com/dsec-dev/dsec/internal/bench"
	"github.com/dsec-dev/dsec/internal/cli"
	"github.com/dsec-dev/dsec/internal/daemon"
)

// Set by the build (-ldflags "-X main.version=… -X main.commit=…").
var (
	version = "dev"
	commit  = ""
)

func main() {
	extra := append(daemon.Commands(daemon.Build{Version: version, Commit: commit}), bench.Command())
	root := cli.NewRoot(version, extra...)
	os.Exit(cli.Execute(context.Background(), root))
}
