package node

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// stepTrack is a tracked exec's mark, or why it has none.
type stepTrack struct {
	tracker sandbox.StepTracker
	mark    sandbox.StepMark
	// untracked says why the tier cannot tell (then tracker is nil).
	untracked string
}

// beginStep marks sb's state before a tracked exec. A tier that cannot
// track steps still runs the command; its step is reported as not
// tracked, which the control plane counts as not pure.
func (a *Service) beginStep(ctx context.Context, sb sandbox.Sandbox, tier string) (*stepTrack, error) {
	t, ok := sb.(sandbox.StepTracker)
	if !ok {
		return &stepTrack{untracked: fmt.Sprintf("the %s tier cannot tell whether a command changed its state", tier)}, nil
	}
	m, err := t.BeginStep(ctx)
	if err != nil {
		return nil, err
	}
	return &stepTrack{tracker: t, mark: m}, nil
}

// endStep compares sb with the mark. A comparison that fails says not
// pure: a step is never called pure by mistake.
func (a *Service) endStep(ctx context.Context, sb sandbox.Sandbox, st *stepTrack) *noderpc.StepInfo {
	if st.tracker == nil {
		return &noderpc.StepInfo{Why: st.untracked}
	}
	pure, why, err := st.tracker.EndStep(context.WithoutCancel(ctx), st.mark)
	if err != nil {
		a.log.Warn("judging whether a step was pure", "sandbox", sb.ID(), "err", err)
		return &noderpc.StepInfo{Tracked: true, Why: sandbox.WhyUnknown}
	}
	return &noderpc.StepInfo{Tracked: true, Pure: pure, Why: why}
}

// beginStepAt records that sandbox id's trajectory step began now (0:
// the request is of no step), for its audit events.
func (a *Service) beginStepAt(id string, step int) {
	if step > 0 && a.opt.Steps != nil {
		a.opt.Steps.SetStep(id, step, time.Now())
	}
}
