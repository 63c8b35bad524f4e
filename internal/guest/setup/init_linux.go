package setup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/dsec-dev/dsec/internal/sys"
)

// forwarded are the signals Init passes on to the command. As PID 1 the
// kernel drops signals that have no handler, so each needs one.
var forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGCONT,
}

// Init runs argv as a child with this process's standard streams and
// environment, forwards signals to it and reaps every child (its own and
// orphans reparented to it) until argv's process exits. It returns that
// process's exit status (128+N if killed by signal N). When this process
// is not PID 1 it makes itself a child subreaper first, so orphans of the
// command are reparented to it, as they would be to PID 1.
//
// Cancelling ctx sends SIGKILL to the command; Init still waits for it.
// Init takes over reaping for the whole process: nothing else in it may
// wait for children while it runs.
func Init(ctx context.Context, argv []string) (int, error) {
	if os.Getpid() != 1 {
		if err := sys.SetChildSubreaper(); err != nil {
			return ExitCannot, err
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return startStatus(err), err
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		return startStatus(err), fmt.Errorf("starting %s: %w", argv[0], err)
	}
	pid := proc.Pid
	defer proc.Release()

	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = sys.Kill(pid, s.(syscall.Signal)) // the command may be gone
			case <-ctx.Done():
				_ = sys.Kill(pid, syscall.SIGKILL)
				return
			case <-done:
				return
			}
		}
	}()

	for {
		var ws syscall.WaitStatus
		got, err := sys.Wait4(-1, &ws, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: the command was reaped elsewhere, against Init's contract.
			return ExitCannot, fmt.Errorf("waiting for %s: %w", argv[0], err)
		}
		if got == pid {
			reapZombies()
			return ExitStatus(ws), nil
		}
	}
}

// reapZombies reaps the children that have already exited, without
// waiting for the others. As PID 1, those left are killed with the PID
// namespace when Init's caller exits.
func reapZombies() {
	for {
		var ws syscall.WaitStatus
		got, err := sys.Wait4(-1, &ws, syscall.WNOHANG)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || got <= 0 {
			return
		}
	}
}
