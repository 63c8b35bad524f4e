package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/sys"
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
// runtime as the first process of a new sandbox, with its config on fd 3,
// a sync pipe on fd 4 and the node's first connection on fd 5: it sets
// the sandbox up (setup.SetupSandbox), reports "ready" or its error on the
// pipe and becomes the sandbox's agent, PID 1, serving that connection
// and, for a node service that restarts, the socket the setup made, until
// the node kills the sandbox. Its stdout and stderr
// are the sandbox's console log on the host: only setup failures and
// agent warnings go there.
//
// The setup empties the capability bounding set of its goroutine's OS
// thread only, so that goroutine stays locked to it and runs every fork
// of a command while the agent serves on other goroutines. That thread
// is not the main one (see setup.ForkThread).
func sandboxMain(stderr io.Writer) int {
	// The main thread is held while the fork thread starts, so that the
	// latter is another; it is then free for the runtime's other work.
	runtime.LockOSThread()
	// Executed through a descriptor, the process is named after it ("7");
	// the main thread's name is the process's in ps.
	_ = os.WriteFile("/proc/thread-self/comm", []byte("dsec-guest"), 0)
	sys.Umask(0o022)
	status, locked := make(chan int, 1), make(chan struct{})
	go func() {
		runtime.LockOSThread() // for good: its bounding set goes
		_ = os.WriteFile("/proc/thread-self/comm", []byte(setup.ForkThread), 0)
		close(locked)
		status <- sandboxAgent(stderr)
	}()
	<-locked
	runtime.UnlockOSThread()
	return <-status
}

// dropPagesAfter is how long after setup the agent unmaps its
// executable's read-only pages (setup.DropFilePages).
const dropPagesAfter = 2 * time.Second

// sandboxAgent is sandboxMain on the fork thread.
func sandboxAgent(stderr io.Writer) int {
	syncPipe := os.NewFile(4, "sandbox-sync")
	nodeConn := os.NewFile(5, "node-conn")
	first, err := net.FileConn(nodeConn)
	nodeConn.Close() // FileConn made its own descriptor
	if err != nil {
		fmt.Fprintf(stderr, "dsec-guest sandbox: the node's connection: %v\n", err)
		fmt.Fprintf(syncPipe, "the node's connection: %v", err)
		return 1
	}
	unixFirst, _ := first.(*net.UnixConn)
	ln, cfg, err := setup.SetupSandbox(os.NewFile(3, "sandbox-config"), unixFirst)
	if err != nil {
		fmt.Fprintf(stderr, "dsec-guest sandbox: %v\n", err)
		fmt.Fprintf(syncPipe, "%v", err)
		return 1
	}
	if _, err := syncPipe.WriteString(setup.Ready); err != nil {
		fmt.Fprintf(stderr, "dsec-guest sandbox: reporting ready: %v\n", err)
		return 1
	}
	syncPipe.Close()
	// Once the node's first calls are done, the setup's code need not
	// stay mapped: an idle agent keeps only what it uses.
	time.AfterFunc(dropPagesAfter, func() { _ = setup.DropFilePages() })
	forks := make(chan forkReq)
	exited := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		exited <- agent.Run(context.Background(), agent.Options{
			Listener: &firstConn{Listener: ln, first: first}, Logger: logger, Version: version, DefaultEnv: cfg.Env,
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

// firstConn is a listener whose first Accept returns a connection made
// before it: the socket pair the node created the sandbox with.
type firstConn struct {
	net.Listener
	once  sync.Once
	first net.Conn
}

func (l *firstConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.first })
	if c != nil {
		return c, nil
	}
	return l.Listener.Accept()
}
