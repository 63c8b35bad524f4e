package function

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

var _ sandbox.Snapshotter = (*Sandbox)(nil)

// snapshotHoldLimit bounds how long a snapshot waits for running calls
// to end and then holds new ones off.
const snapshotHoldLimit = 2 * time.Minute

// CaptureState implements sandbox.Snapshotter: calls and file operations
// are held off (running ones end first) while the workspace is copied
// under "workspace" in the layer, where a sandbox created from it finds
// it again (see seedWorkspace).
func (s *Sandbox) CaptureState(ctx context.Context, dst string, since *sandbox.StateIndex) (*sandbox.StateIndex, sandbox.CaptureStats, error) {
	ctx, cancel := context.WithTimeout(ctx, snapshotHoldLimit)
	defer cancel()
	start := time.Now()
	release, ok, err := s.ops.hold(ctx)
	if err != nil {
		return nil, sandbox.CaptureStats{}, fmt.Errorf("snapshot of sandbox %s: waiting for its calls to end: %w", s.spec.ID, err)
	}
	if !ok {
		return nil, sandbox.CaptureStats{}, sandbox.ErrGone(s.spec.ID)
	}
	defer release()
	idx, st, err := sandbox.CaptureState(ctx, sandbox.CaptureOptions{Src: s.workDir, Dst: dst, Prefix: workspaceInLayer, Since: since})
	st.Frozen = time.Since(start)
	if err != nil {
		return nil, st, fmt.Errorf("snapshot of sandbox %s: %w", s.spec.ID, err)
	}
	return idx, st, nil
}

// workspaceInLayer is where a state layer holds the workspace.
const workspaceInLayer = "workspace"
