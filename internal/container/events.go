package container

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Audit events the node sees itself, besides the kernel monitor's: what
// it did to a sandbox's processes (a phase change's kills, a destroy's)
// and what it refused a sandbox (a file API path leading out of it, output
// past its cap). Process details come from the host's /proc, never from
// the agent.

// record records e for the sandbox in its current phase.
func (s *Sandbox) record(e monitor.Event) {
	if s.rt.opt.Monitor != nil {
		s.recordIn(s.Phase(), e)
	}
}

// recordIn records e for the sandbox in phase (for callers holding
// phaseMu, which Phase takes).
func (s *Sandbox) recordIn(phase string, e monitor.Event) {
	rec := s.rt.opt.Monitor
	if rec == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	rec.Record(s.id, phase, e)
}

// recordProcess records an event of kind about process pid, in phase.
func (s *Sandbox) recordProcess(phase, kind string, pid int) {
	if s.rt.opt.Monitor == nil {
		return
	}
	e := monitor.Event{Kind: kind, Pid: uint32(pid)}
	proc := "/proc/" + strconv.Itoa(pid) + "/"
	if b, err := os.ReadFile(proc + "comm"); err == nil {
		e.Comm = strings.TrimSpace(string(b))
	}
	e.Path, _ = os.Readlink(proc + "exe")
	if b, err := os.ReadFile(proc + "status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == "Uid:" {
				uid, _ := strconv.ParseUint(f[2], 10, 32) // effective
				e.UID = uint32(uid)
			}
		}
	}
	s.recordIn(phase, e)
}

// refused passes err on, recording a file API call (op on p) whose path
// led out of the sandbox's root: as asked, or through the sandbox's
// symlinks.
func (s *Sandbox) refused(op, p string, err error) error {
	if errdefs.CodeOf(err) == sandbox.CodePathOutsideRoot {
		s.record(monitor.Event{Kind: monitor.KindFileAPI, Syscall: op, Path: p})
	}
	return err
}

// survivors records the processes besides the agent that a destroy is
// about to kill (a time bomb, a daemon left running).
func (s *Sandbox) survivors() {
	if s.rt.opt.Monitor == nil || s.cg == nil {
		return
	}
	procs, err := s.cg.Procs()
	if err != nil {
		return
	}
	phase := s.Phase()
	for _, pid := range procs {
		if pid != s.state.Pid {
			s.recordProcess(phase, monitor.KindDestroyKill, pid)
		}
	}
}
