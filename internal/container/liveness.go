package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// The agent's liveness. A sandbox is its agent, PID 1 of its pid
// namespace: when the agent ends, the kernel kills every other process
// of the sandbox and nothing can run in it again. The agent is
// protected from what sandbox root could do to it (its limits:
// seccomp's prlimit64 rule; its memory: the commands memory group), and
// if it ends nevertheless (a bug, an attack nobody thought of), the
// runtime notices at once through a pidfd on the Go poller (one parked
// goroutine per sandbox, no thread, no extra process), releases the
// sandbox as Destroy does, records a sandbox-ended audit event and tells
// the node (sandbox.EndNotifier), which fails the sandbox's record.

var _ sandbox.EndNotifier = (*Runtime)(nil)

// agentMemoryBytes is the memory a sandbox's agent has beside its commands'
// memory_mb (cgroups.Limits.AgentMemoryBytes): an idle agent holds 2–4
// MiB; its heap under load and what the files API writes into the
// sandbox come from it. It is a limit, not a reservation.
const agentMemoryBytes = 32 << 20

// OnEnd implements sandbox.EndNotifier.
func (r *Runtime) OnEnd(fn func(sandbox.Ended)) { r.ends.OnEnd(fn) }

// placeCommands moves the agent's fork thread (setup.ForkThread) into the
// sandbox's commands memory group, so that every command it starts is
// charged and OOM-killed there and never the agent (cgroups.CommandsGroup).
// It runs once the agent has answered, before any command. A layout
// without the commands group (v2) has nothing to do; an agent that does
// not name its fork thread (an older binary, whose fork thread is its
// main one, which must stay outside) is logged and left as it is.
func (r *Runtime) placeCommands(pid int, cg *cgroups.Group) error {
	if !cg.SplitsCommands() {
		return nil
	}
	tid, err := forkThread(pid)
	if errors.Is(err, errNoForkThread) {
		r.log.Warn("the agent names no fork thread: its commands share its memory group, where the OOM killer may choose it", "pid", pid)
		return nil
	}
	if err != nil {
		return err
	}
	return cg.AddCommandThread(tid)
}

var errNoForkThread = errors.New("the agent names no fork thread")

// forkThread finds the thread of process pid named setup.ForkThread.
func forkThread(pid int) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(b)) != setup.ForkThread {
			continue
		}
		tid, err := strconv.Atoi(e.Name())
		if err != nil || tid == pid {
			break // never the leader: it would take the agent along
		}
		return tid, nil
	}
	return 0, errNoForkThread
}

// openExitWatch opens the watch on s's agent (its first process), and
// reads the OOM kill count it is judged against. It fails if the agent
// is gone.
func (s *Sandbox) openExitWatch() error {
	w, err := sys.WatchExit(s.state.Pid)
	if err != nil {
		return fmt.Errorf("the sandbox's agent: %w", err)
	}
	oom := s.cg.OwnOOMKills()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		w.Close()
		return sandbox.ErrGone(s.id)
	}
	s.exit, s.oomBase = w, oom
	return nil
}

// watchAgent waits, on a goroutine of its own, for the end of the agent
// openExitWatch watches. An end that Destroy or detach did not ask for
// is the sandbox's failure: it is recorded, the sandbox destroyed and
// the node told.
func (s *Sandbox) watchAgent() {
	s.mu.Lock()
	w := s.exit
	s.mu.Unlock()
	if w == nil {
		return
	}
	go func() {
		if err := w.Wait(); err != nil {
			return // closed: destroyed or detached
		}
		s.mu.Lock()
		asked := s.destroyed
		s.mu.Unlock()
		if asked {
			return
		}
		end := s.agentEnd(w)
		s.rt.log.Warn("a sandbox's agent ended", "sandbox", s.id, "reason", end.Reason())
		comm := "dsec-guest"
		s.record(monitor.Event{Kind: monitor.KindSandboxEnded, Pid: uint32(end.Pid), UID: uint32(s.rt.opt.HostUID),
			Comm: comm, Path: "/" + GuestPath, Ret: int64(end.Status), Detail: end.Reason()})
		if err := s.rt.ends.Ended(end, s.Destroy); err != nil {
			s.rt.log.Error("releasing a sandbox whose agent ended", "sandbox", s.id, "err", err)
		}
	}()
}

// statusWait bounds the wait for the kernel's exit status of an agent
// that ended: its parent (the zygote) lets the kernel reap it at once,
// but an adopted agent whose zygote is gone waits for init.
const statusWait = 200 * time.Millisecond

// agentEnd says how s's agent, watched by w, ended.
func (s *Sandbox) agentEnd(w *sys.ExitWatch) sandbox.Ended {
	end := sandbox.Ended{ID: s.id, Code: sandbox.EndAgentExited, Pid: w.Pid(), Status: -1}
	ws, ok := w.Status()
	for deadline := time.Now().Add(statusWait); !ok && time.Now().Before(deadline); ws, ok = w.Status() {
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	oomBase := s.oomBase
	s.mu.Unlock()
	oom := s.cg.OwnOOMKills() > oomBase
	switch {
	case !ok:
		end.Detail = "it is gone (the kernel gave no exit status)"
	case ws.Signaled():
		end.Status = int(ws)
		end.Detail = "killed by " + signalName(ws.Signal())
	default:
		end.Status = int(ws)
		end.Detail = fmt.Sprintf("exited with status %d", ws.ExitStatus())
	}
	if oom && (!ok || ws.Signaled() && ws.Signal() == syscall.SIGKILL) {
		end.Detail += " (by the kernel's OOM killer: the sandbox's memory was full)"
	}
	return end
}

func signalName(sig syscall.Signal) string {
	if n := sys.SignalName(sig); n != "" {
		return n
	}
	return "signal " + strconv.Itoa(int(sig))
}

// closeExitWatch stops watching the agent (Destroy, detach).
func (s *Sandbox) closeExitWatch() {
	s.mu.Lock()
	w := s.exit
	s.exit = nil
	s.mu.Unlock()
	if w != nil {
		w.Close()
	}
}
