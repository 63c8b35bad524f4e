package function

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

var _ sandbox.StepTracker = (*Sandbox)(nil)

// BeginStep implements sandbox.StepTracker: a digest of the workspace,
// the tier's only writable state (calls leave no process behind).
func (s *Sandbox) BeginStep(ctx context.Context) (sandbox.StepMark, error) {
	return s.mark(ctx)
}

// EndStep implements sandbox.StepTracker.
func (s *Sandbox) EndStep(ctx context.Context, before sandbox.StepMark) (bool, string, error) {
	after, err := s.mark(ctx)
	if err != nil {
		return false, "", err
	}
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
		return sandbox.StepMark{}, fmt.Errorf("sandbox %s: %w", s.spec.ID, err)
	}
	return sandbox.StepMark{Tree: tree}, nil
}
