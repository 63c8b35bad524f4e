package function

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

var _ sandbox.StepTracker = (*Sandbox)(nil)

// BeginStep implements sandbox.StepTracker: a digest of the workspace,
// the tier's only writable state (calls leave no process behind).
// As on the container tier, the last step's closing mark serves as the
// next one's (changes in between count against the next step).
func (s *Sandbox) BeginStep(ctx context.Context) (sandbox.StepMark, error) {
	s.markMu.Lock()
	last := s.lastMark
	s.markMu.Unlock()
	if last != nil {
		if err := s.enter(); err != nil {
			return sandbox.StepMark{}, err
		}
		s.ops.leave()
		return *last, nil
	}
	return s.mark(ctx)
}

// EndStep implements sandbox.StepTracker.
func (s *Sandbox) EndStep(ctx context.Context, before sandbox.StepMark) (bool, string, error) {
	after, err := s.mark(ctx)
	if err != nil {
		return false, "", err
	}
	s.markMu.Lock()
	if after.Unknown == "" {
		s.lastMark = &after
	}
	s.markMu.Unlock()
	pure, why := sandbox.CompareMarks(before, after)
	return pure, why, nil
}

func (s *Sandbox) mark(ctx context.Context) (sandbox.StepMark, error) {
	if err := s.enter(); err != nil {
		return sandbox.StepMark{}, err
	}
	defer s.ops.leave()
	tree, _, err := sandbox.TreeMark(ctx, s.work)
	if err != nil {
		if ctx.Err() != nil {
			return sandbox.StepMark{}, fmt.Errorf("sandbox %s: %w", s.spec.ID, err)
		}
		// A workspace the walk cannot take must not stop the call: the
		// step is just not pure.
		return sandbox.StepMark{Unknown: err.Error()}, nil
	}
	return sandbox.StepMark{Tree: tree}, nil
}

// DropMark implements sandbox.MarkDropper.
func (s *Sandbox) DropMark() {
	s.markMu.Lock()
	s.lastMark = nil
	s.markMu.Unlock()
}
