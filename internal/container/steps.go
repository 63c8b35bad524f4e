package container

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

var _ sandbox.StepTracker = (*Sandbox)(nil)

// unknownUpper is why a sandbox adopted after a node restart cannot
// judge its steps: its upper was detached from every mount table, and
// the handle on it went with the node that made it.
const unknownUpper = "the node restarted since the sandbox was created: its writable layer is out of the node's reach"

// BeginStep implements sandbox.StepTracker: a digest of every entry of
// the upper tmpfs, and the processes of the sandbox's cgroup.
// The last step's closing mark serves as the next one's: state changed
// in between (a background process, the files API) then counts against
// the next step, which is never wrongly pure that way, and a tracked
// exec walks the upper once instead of twice.
func (s *Sandbox) BeginStep(ctx context.Context) (sandbox.StepMark, error) {
	s.umu.Lock()
	last := s.lastMark
	s.umu.Unlock()
	if last != nil {
		if err := s.checkLive(); err != nil {
			return sandbox.StepMark{}, err
		}
		return *last, nil
	}
	return s.mark(ctx)
}

// EndStep implements sandbox.StepTracker.
func (s *Sandbox) EndStep(ctx context.Context, before sandbox.StepMark) (bool, string, error) {
	if before.Unknown != "" {
		return false, sandbox.WhyUnknown, nil
	}
	after, err := s.mark(ctx)
	if err != nil {
		return false, "", err
	}
	s.umu.Lock()
	if after.Unknown == "" {
		s.lastMark = &after
	}
	s.umu.Unlock()
	pure, why := sandbox.CompareMarks(before, after)
	return pure, why, nil
}

func (s *Sandbox) mark(ctx context.Context) (sandbox.StepMark, error) {
	var m sandbox.StepMark
	s.umu.Lock()
	if s.upper == nil {
		s.umu.Unlock()
		if err := s.checkLive(); err != nil {
			return m, err
		}
		m.Unknown = unknownUpper
		return m, nil
	}
	tree, _, err := sandbox.TreeMark(ctx, s.upper)
	s.umu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return m, ctx.Err()
		}
		// A state the walk cannot take (nested past its bound) must not
		// stop the command: the step is just not pure.
		m.Unknown = err.Error()
		return m, nil
	}
	m.Tree = tree
	if m.Procs, err = s.liveProcs(); err != nil {
		return m, fmt.Errorf("sandbox %s: listing its processes: %w", s.id, err)
	}
	return m, nil
}

// liveProcs lists the sandbox's processes, sorted, without zombies (a
// command's child that exited and is not reaped yet is not state), nor
// processes that are exiting or have a fatal signal pending: `pkill`
// returns before its targets die, and a step that killed them must not
// be judged pure because they had not run yet.
func (s *Sandbox) liveProcs() ([]int, error) {
	procs, err := s.cg.Procs()
	if err != nil {
		return nil, err
	}
	s.phaseMu.RLock()
	agent := s.state.Pid
	s.phaseMu.RUnlock()
	out := procs[:0]
	for _, p := range procs {
		if p == agent {
			// The agent: always there while the sandbox is, and if it
			// were dying the step fails anyway. Not reading its stat and
			// status halves a mark's cost (two /proc reads of ~30 µs).
			out = append(out, p)
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil || zombie(b) || exiting(b) {
			continue
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p)); err != nil || dying(st) {
			continue
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

// checkLive fails once the sandbox is destroyed.
func (s *Sandbox) checkLive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return sandbox.ErrGone(s.id)
	}
	return nil
}

// closeUpper drops the handle on the upper (its tmpfs goes once the
// overlay has gone too).
func (s *Sandbox) closeUpper() {
	s.umu.Lock()
	defer s.umu.Unlock()
	if s.upper != nil {
		s.upper.Close()
		s.upperDir.Close()
		s.upper, s.upperDir = nil, nil
	}
	s.lastMark = nil
}

// openUpper opens the overlay's upper directory (in the upper tmpfs)
// twice: as a directory, whose /proc/self/fd path reaches it once it is
// detached, and as an os.Root through that path.
func openUpper(dir string) (*os.File, *os.Root, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the writable layer: %w", err)
	}
	r, err := os.OpenRoot(fdPath(f))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("opening the writable layer: %w", err)
	}
	return f, r, nil
}

// fdPath is the path of f's directory through /proc/self/fd.
func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// DropMark implements sandbox.MarkDropper.
func (s *Sandbox) DropMark() {
	s.umu.Lock()
	s.lastMark = nil
	s.umu.Unlock()
}
