package container

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

var _ sandbox.Snapshotter = (*Sandbox)(nil)

// snapshotFreezeLimit bounds how long a snapshot holds a sandbox frozen:
// a capture that takes longer is abandoned (the sandbox thaws, nothing
// is stored) rather than stall the sandbox.
const snapshotFreezeLimit = 2 * time.Minute

// CaptureState implements sandbox.Snapshotter: the sandbox's cgroup is
// frozen (no phase change meanwhile) while its upper is copied, ids
// shifted back to the sandbox's own (as image layers hold them).
func (s *Sandbox) CaptureState(ctx context.Context, dst string, since *sandbox.StateIndex) (*sandbox.StateIndex, sandbox.CaptureStats, error) {
	s.umu.Lock()
	defer s.umu.Unlock()
	if s.upperDir == nil {
		if err := s.checkLive(); err != nil {
			return nil, sandbox.CaptureStats{}, err
		}
		return nil, sandbox.CaptureStats{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"sandbox %s cannot be snapshotted: the node restarted since it was created, and its writable layer, which is in no mount table, went out of the node's reach; resume it from its trajectory instead", s.id)
	}
	if err := s.checkLive(); err != nil {
		return nil, sandbox.CaptureStats{}, err
	}
	s.phaseMu.Lock()
	defer s.phaseMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, snapshotFreezeLimit)
	defer cancel()
	start := time.Now()
	if err := s.cg.Freeze(ctx); err != nil {
		return nil, sandbox.CaptureStats{}, fmt.Errorf("freezing sandbox %s for a snapshot: %w", s.id, err)
	}
	idx, st, err := sandbox.CaptureState(ctx, sandbox.CaptureOptions{
		Src: fdPath(s.upperDir), Dst: dst, Since: since, Overlay: true,
		IDBase: uint32(s.rt.opt.HostUID), IDCount: uint32(s.rt.opt.IDCount),
	})
	if terr := s.cg.Thaw(context.WithoutCancel(ctx)); terr != nil && err == nil {
		err = terr
	}
	st.Frozen = time.Since(start)
	if err != nil {
		return nil, st, fmt.Errorf("snapshot of sandbox %s: %w", s.id, err)
	}
	return idx, st, nil
}
