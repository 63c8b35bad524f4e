// Package setup is the part of dsec-guest that makes a container sandbox.
// SetupSandbox is the trusted setup that runs inside the sandbox's new
// namespaces before anything of the image does: mounts, /proc, /dev and
// /sys with their masks, the /etc files, pivot_root, the capability
// bounding set and the seccomp filter; it returns the listener the agent
// (package agent) then serves on. Zygote is the small process that forks
// sandboxes for the node (SandboxCommand, StartSandbox), SandboxConfig and
// ZygoteRequest what the node sends them. Main is `dsec-guest init`, a
// minimal init that runs one command, forwards signals, reaps every child
// reparented to it and exits with the command's status. A VM guest's init
// is package vminit.
//
// The package is kept small and free of DSec's daemon packages so that the
// binary stays a few MiB and static (CGO_ENABLED=0).
package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"syscall"
)

// Usage is the command-line help of dsec-guest.
const Usage = `dsec-guest: DSec's in-sandbox agent.

Usage:
  dsec-guest init [--] COMMAND [ARG...]
        Run COMMAND as a child, forward signals to it, reap every process
        reparented to this one (as PID 1, or as a child subreaper when not
        PID 1) and exit with COMMAND's status (128+N if killed by signal N).
  dsec-guest version
        Print the version.
  dsec-guest help | --help | -h
        Print this help.
`

// Exit statuses of Main besides the command's own.
const (
	ExitUsage    = 2   // bad command line
	ExitNotFound = 127 // the command could not be found
	ExitCannot   = 126 // the command could not be started
)

// Main runs dsec-guest with args (without the program name) and returns
// the process's exit status.
func Main(ctx context.Context, version string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, Usage)
		return ExitUsage
	}
	switch args[0] {
	case "version", "--version":
		fmt.Fprintf(stdout, "dsec-guest %s\n", version)
		return 0
	case "help", "--help", "-h":
		fmt.Fprint(stdout, Usage)
		return 0
	case "init":
		cmd := args[1:]
		if len(cmd) > 0 && cmd[0] == "--" {
			cmd = cmd[1:]
		}
		if len(cmd) == 0 {
			fmt.Fprintln(stderr, "dsec-guest init: no command given")
			return ExitUsage
		}
		status, err := Init(ctx, cmd)
		if err != nil {
			fmt.Fprintf(stderr, "dsec-guest init: %v\n", err)
		}
		return status
	default:
		fmt.Fprintf(stderr, "dsec-guest: unknown command %q\n\n%s", args[0], Usage)
		return ExitUsage
	}
}

// ExitStatus turns a wait status into a shell-style exit status: the
// exit code, or 128+N for a process killed by signal N.
func ExitStatus(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 255
}

// startStatus maps an error starting the command to its exit status.
func startStatus(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
		return ExitNotFound
	}
	return ExitCannot
}
