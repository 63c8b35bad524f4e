package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sys"
)

// A phase change inside a microVM guest (Options.Phases): the agent, PID
// 1 of the guest, kills every other process with kill(-1, SIGKILL)
// sweeps until /proc shows none left but kernel threads (a process with
// SIGKILL pending cannot fork, so the sweeps converge even against a fork
// bomb; phaseKillTimeout bounds them), then replaces the earlier phase's
// writable binds with the new one's and makes the root mount read-only
// (sys.BindWritable resolves each path from the root without following
// symlinks and without leaving the root mount). /dev, /dev/shm, /proc
// and /sys are separate mounts and unaffected, as in a container.

// phaseKillTimeout bounds the kill sweeps of a phase change.
const phaseKillTimeout = 10 * time.Second

func (a *agent) phase(c *agentproto.Call) {
	if !a.opt.Phases {
		c.Reply(nil, errdefs.New(errdefs.Unsupported, api.CodePhaseUnsupported, "this agent does not apply phases: its host does"))
		return
	}
	serve(c, a.applyPhase)
}

// applyPhase ends the earlier phase's processes and applies args.
func (a *agent) applyPhase(c *agentproto.Call, args agentproto.PhaseArgs) {
	a.phaseMu.Lock()
	defer a.phaseMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), phaseKillTimeout)
	defer cancel()
	killed, err := killOthers(ctx)
	if err != nil {
		c.Reply(nil, errdefs.Wrap(errdefs.Internal, api.CodePhaseKillFailed, err, "ending the earlier phase's processes"))
		return
	}
	if args.NoRoot {
		if err := noRoot(); err != nil {
			c.Reply(nil, errdefs.Wrap(errdefs.Internal, api.CodePhaseNoRootFailed, err, "restricting root's capabilities"))
			return
		}
	}
	if err := a.setWritable(args.Writable); err != nil {
		c.Reply(nil, err)
		return
	}
	c.Reply(agentproto.PhaseResult{Killed: killed}, nil)
}

// killOthers kills every process but the caller's and kernel threads,
// until none is left (zombies aside: they hold no files), and returns
// how many it saw.
func killOthers(ctx context.Context) (int, error) {
	self := os.Getpid()
	seen := map[int]bool{}
	for {
		if err := sys.Kill(-1, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return len(seen), fmt.Errorf("kill(-1): %w", err)
		}
		left, err := userProcesses(self)
		if err != nil {
			return len(seen), err
		}
		for _, pid := range left {
			seen[pid] = true
		}
		if len(left) == 0 {
			return len(seen), nil
		}
		select {
		case <-ctx.Done():
			return len(seen), fmt.Errorf("%d processes are left: %w", len(left), ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// pfKthread is PF_KTHREAD, in /proc/<pid>/stat's flags.
const pfKthread = 0x00200000

// userProcesses lists the live processes other than self that are not
// kernel threads or zombies.
func userProcesses(self int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid pgrp session tty_nr tpgid flags …; comm
		// may hold anything, so fields count from its last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 7 || string(f[0]) == "Z" || string(f[0]) == "X" {
			continue
		}
		flags, err := strconv.ParseUint(string(f[6]), 10, 64)
		if err != nil || flags&pfKthread != 0 {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// noRoot sets SECBIT_NOROOT, locked, on every thread of the agent: a
// command it starts as uid 0 then holds only the capabilities its exec
// names (ambient), as in a container.
func noRoot() error {
	if err := sys.SetProcessNoRoot(); err != nil {
		return fmt.Errorf("setting SECBIT_NOROOT: %w", err)
	}
	return nil
}

// setWritable makes only writable (nil: everything) writable in the
// root, after the earlier phase's (sys.ReplaceWritable: a path that
// cannot be bound leaves the earlier binds; any other failure leaves
// nothing writable).
// Preconditions: a.phaseMu must be held.
func (a *agent) setWritable(writable []string) error {
	if slices.Equal(a.writable, writable) && (a.writable == nil) == (writable == nil) {
		return nil
	}
	err := sys.ReplaceWritable(a.writable, writable, 0, 0)
	var ue *sys.UnbindableError
	switch {
	case errors.As(err, &ue):
		return errdefs.Wrap(errdefs.Invalid, api.CodePhaseWritablePath, ue.Err, "writable path %s", ue.Path)
	case err != nil:
		a.writable = []string{}
		return errdefs.Wrap(errdefs.Internal, api.CodePhaseWritableFailed, err, "applying the writable paths")
	}
	a.writable = slices.Clone(writable)
	if writable != nil && a.writable == nil {
		a.writable = []string{}
	}
	return nil
}
