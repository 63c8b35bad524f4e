package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// reaper is the process's one waiter for children. Nothing else in the
// process may wait for the children it starts (no exec.Cmd.Wait on them):
// it collects exit statuses with wait4 on SIGCHLD and hands each to the
// proc it belongs to.
//
// In "reap all" mode (PID 1, or a child subreaper standing in for it) it
// waits for any child, so orphans reparented to the agent are reaped too.
// Otherwise (an agent embedded in a bigger process: tests) it waits only
// for the pids it started, leaving other children to their owners.
//
// Starting a process, reaping it and signalling it all happen under mu, so
// a pid is never signalled after it was reaped (and possibly reused).
type reaper struct {
	mu    sync.Mutex // guards following fields
	procs map[int]*proc
	all   bool
	users int
	stop  chan struct{}
	done  chan struct{}
}

var theReaper = reaper{procs: map[int]*proc{}}

// pollInterval is a safety net behind SIGCHLD. Coalesced signals lose
// nothing (each reap collects every status there is), so it is long: an
// idle agent must not wake up, or thousands of idle sandboxes on a node
// (each agent a Go process whose wake-ups also spin its sysmon) take
// the node's CPU — at 1 s, 2,600 idle agents used most of 2 cores.
const pollInterval = time.Minute

// acquire starts the reaper loop for one more agent; all switches the
// process into reap-all mode for good.
func (r *reaper) acquire(all bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = r.all || all
	r.users++
	if r.users > 1 {
		return
	}
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go r.loop(sigs, r.stop, r.done)
}

// release stops the loop when its last agent is gone.
func (r *reaper) release() {
	r.mu.Lock()
	r.users--
	if r.users > 0 {
		r.mu.Unlock()
		return
	}
	stop, done := r.stop, r.done
	r.mu.Unlock()
	close(stop)
	<-done
}

func (r *reaper) loop(sigs chan os.Signal, stop, done chan struct{}) {
	defer close(done)
	defer signal.Stop(sigs)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
		case <-tick.C:
		case <-stop:
			return
		}
		r.reap()
	}
}

// reap collects every exit status available now.
func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.all {
		for {
			var ws syscall.WaitStatus
			pid, err := sys.Wait4(-1, &ws, syscall.WNOHANG)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			r.exitedLocked(pid, ws)
		}
		return
	}
	for pid := range r.procs {
		var ws syscall.WaitStatus
		got, err := sys.Wait4(pid, &ws, syscall.WNOHANG)
		for errors.Is(err, syscall.EINTR) {
			got, err = sys.Wait4(pid, &ws, syscall.WNOHANG)
		}
		if got == pid && err == nil {
			r.exitedLocked(pid, ws)
		}
	}
}

// exitedLocked records pid's exit.
// Preconditions: r.mu must be held.
func (r *reaper) exitedLocked(pid int, ws syscall.WaitStatus) {
	p := r.procs[pid]
	if p == nil {
		return // an orphan reparented to us, or not ours
	}
	delete(r.procs, pid)
	p.status = ws
	p.endedAt = time.Now()
	close(p.exited)
}

// start runs fork (which starts a process and returns its pid) and
// registers the process as p, under the lock so that the reaper cannot
// reap it before it is registered.
func (r *reaper) start(p *proc, fork func() (int, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return err
	}
	p.pid = pid
	r.procs[pid] = p
	return nil
}

// signalGroup sends sig to p's process group (p leads it). It fails with
// syscall.ESRCH once the group is gone.
func (r *reaper) signalGroup(p *proc, sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// After the leader is reaped its pid stays reserved as long as the
	// group has members, so -pid still names this group, or none.
	return sys.Kill(-p.pid, sig)
}
