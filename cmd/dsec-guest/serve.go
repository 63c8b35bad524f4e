package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/signal"
	"syscall"

	"github.com/dsec-dev/dsec/internal/guest/agent"
)

// serve is the hidden `dsec-guest serve --socket PATH` subcommand: the
// agent alone on a Unix socket, without the sandbox setup that normally
// runs first, for tests and benchmarks. It reaps orphans as a child
// subreaper and stops on SIGTERM or SIGINT.
func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "listen on this Unix socket path")
	root := fs.String("root", "/", "confine the files API to this directory")
	workdir := fs.String("workdir", "", "working directory of commands")
	anyPeer := fs.Bool("any-peer", false, "accept peers in the agent's own pid namespace (tests only)")
	verbose := fs.Bool("v", false, "log to stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *socket == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: dsec-guest serve --socket PATH [--root DIR] [--workdir DIR] [--any-peer] [-v]")
		return 2
	}
	ln, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintf(stderr, "dsec-guest serve: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	opt := agent.Options{Listener: ln, Version: version, Root: *root, Workdir: *workdir, Subreaper: true}
	if *verbose {
		opt.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	if *anyPeer {
		opt.PeerCheck = func(agent.Peer) error { return nil }
	}
	if err := agent.Run(ctx, opt); err != nil {
		fmt.Fprintf(stderr, "dsec-guest serve: %v\n", err)
		return 1
	}
	return 0
}
