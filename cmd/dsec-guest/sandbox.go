package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"syscall"

	"github.com/dsec-dev/dsec/internal/agent"
	"github.com/dsec-dev/dsec/internal/guest"
)

// forkReq is a fork the agent asks the setup thread to run.
type forkReq struct {
	fork func() (int, error)
	done chan forkRes
}

type forkRes struct {
	pid int
	err error
}

// sandboxMain is `dsec-guest sandbox`, run only by the node's container
// runtime as the first process of a new sandbox, with its config on fd 3
// and a sync pipe on fd 4: it sets the sandbox up (guest.SetupSandbox),
// reports "ready" or its error on the pipe and becomes the sandbox's
// agent, PID 1, until the node kills the sandbox. Its stdout and stderr
// are the sandbox's console log on the host: only setup failures and
// agent warnings go there.
//
// The setup empties the capability bounding set of this goroutine's OS
// thread only, so this goroutine stays locked to it and runs every fork
// of a command while the agent serves on other goroutines.
func sandboxMain(stderr io.Writer) int {
	runtime.LockOSThread()
	syscall.Umask(0o022)
	sync := os.NewFile(4, "sandbox-sync")
	ln, cfg, err := guest.SetupSandbox(os.NewFile(3, "sandbox-config"))
	if err != nil {
		fmt.Fprintf(stderr, "dsec-guest sandbox: %v\n", err)
		fmt.Fprintf(sync, "%v", err)
		return 1
	}
	if _, err := sync.WriteString(guest.Ready); err != nil {
		fmt.Fprintf(stderr, "dsec-guest sandbox: reporting ready: %v\n", err)
		return 1
	}
	sync.Close()
	forks := make(chan forkReq)
	exited := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		exited <- agent.Run(context.Background(), agent.Options{
			Listener: ln, Logger: logger, Version: version, DefaultEnv: cfg.Env,
			Fork: func(fork func() (int, error)) (int, error) {
				r := forkReq{fork: fork, done: make(chan forkRes, 1)}
				forks <- r
				res := <-r.done
				return res.pid, res.err
			},
		})
	}()
	for {
		select {
		case r := <-forks:
			pid, err := r.fork()
			r.done <- forkRes{pid, err}
		case err := <-exited:
			if err != nil {
				fmt.Fprintf(stderr, "dsec-guest sandbox: %v\n", err)
				return 1
			}
			return 0
		}
	}
}
