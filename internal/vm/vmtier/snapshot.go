package vmtier

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

var _ sandbox.Snapshotter = (*Sandbox)(nil)

// Snapshots (sandbox.Snapshotter). The writable state of a VM is the
// overlay upper on its upper disk, a file system the guest's kernel
// made and writes. The node never mounts or parses it: a crafted ext4
// image mounted on the host would put the host kernel's file system code
// in front of the guest. The guest's agent does the file system side
// instead (agentproto.CapState): it syncs and freezes the upper's file
// system (FIFREEZE: the guest runs on, its writes to the upper wait), lists the upper
// directory, streams the files the node asks for, and thaws. The node
// checks the listing and the content as hostile and builds the layer
// from them with the same capture as the container tier's
// (sandbox.CaptureOptions.Listing): the same index, so incremental
// snapshots read only what changed, the same whiteouts and opaque
// directories, ids as the guest has them (a VM has no id shift).

// snapshotFreezeLimit bounds how long a snapshot keeps the guest's upper
// frozen; the agent holds the same bound on its side (agentproto.MaxFreeze),
// so a node that dies mid-snapshot does not stall the guest longer.
const snapshotFreezeLimit = agentproto.MaxFreeze

// CaptureState implements sandbox.Snapshotter: the guest's agent freezes
// its upper's file system while the node lists it and copies what
// changed since the index since; the thaw always follows, on error too.
func (s *Sandbox) CaptureState(ctx context.Context, dst string, since *sandbox.StateIndex) (*sandbox.StateIndex, sandbox.CaptureStats, error) {
	if !s.upperDisk {
		return nil, sandbox.CaptureStats{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"sandbox %s cannot be snapshotted: its writable layer is a tmpfs in the guest's memory ([%s] upper = %q), which cannot be frozen; snapshots need the upper disk (upper = %q)",
			s.id, s.rt.Tier(), UpperTmpfs, UpperDisk)
	}
	c, err := s.agent.Client()
	if err != nil {
		return nil, sandbox.CaptureStats{}, err
	}
	if !c.HasCap(agentproto.CapState) {
		return nil, sandbox.CaptureStats{}, errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier,
			"sandbox %s cannot be snapshotted: its guest agent predates snapshots of the %s tier (recreate it)", s.id, s.rt.Tier())
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotFreezeLimit)
	defer cancel()
	start := time.Now()
	if err := c.Freeze(ctx, agentproto.FreezeArgs{TimeoutMS: snapshotFreezeLimit.Milliseconds()}); err != nil {
		// A freeze that timed out on the node may still land in the
		// guest: thaw whatever happened.
		_ = s.thaw(ctx, c)
		return nil, sandbox.CaptureStats{Frozen: time.Since(start)}, freezeFailed(err, s.id)
	}
	idx, st, err := s.capture(ctx, c, dst, since)
	if terr := s.thaw(ctx, c); terr != nil && err == nil {
		err = terr
	}
	st.Frozen = time.Since(start)
	if err != nil {
		return nil, st, fmt.Errorf("snapshot of sandbox %s: %w", s.id, err)
	}
	return idx, st, nil
}

// capture lists the frozen upper and copies it into dst.
func (s *Sandbox) capture(ctx context.Context, c *agentproto.Client, dst string, since *sandbox.StateIndex) (*sandbox.StateIndex, sandbox.CaptureStats, error) {
	list, err := c.StateList(ctx)
	if err != nil {
		return nil, sandbox.CaptureStats{}, fmt.Errorf("listing the guest's writable layer: %w", err)
	}
	return sandbox.CaptureState(ctx, sandbox.CaptureOptions{
		Dst: dst, Since: since, Overlay: true,
		Listing: list,
		Read: func(ctx context.Context, p string) (io.ReadCloser, error) {
			return c.StateRead(ctx, p)
		},
		MaxBytes: int64(s.upperMiB()) << 20,
	})
}

// thaw thaws the guest's upper whatever ctx's state (a cancelled
// snapshot still thaws), within a bound of its own.
func (s *Sandbox) thaw(ctx context.Context, c *agentproto.Client) error {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentproto.DefaultCallTimeout)
	defer cancel()
	if err := c.Thaw(tctx); err != nil {
		if errdefs.CodeOf(err) == api.CodeStateFreezeExpired {
			return err
		}
		return errdefs.Within(errdefs.Unavailable, api.CodeStateFreezeFailed, err, "thawing the guest's writable layer")
	}
	return nil
}

// freezeFailed classifies a failed freeze: the agent's own refusals keep
// their code, the rest is state_freeze_failed.
func freezeFailed(err error, id string) error {
	switch errdefs.CodeOf(err) {
	case api.CodeUnsupportedOnTier, api.CodeStateFreezeFailed:
		return fmt.Errorf("snapshot of sandbox %s: %w", id, err)
	}
	return errdefs.Within(errdefs.Unavailable, api.CodeStateFreezeFailed, err, "snapshot of sandbox %s: freezing its writable layer", id)
}

// upperMiB is the size of the sandbox's upper disk.
func (s *Sandbox) upperMiB() int {
	if s.spec.DiskMB > 0 {
		return s.spec.DiskMB
	}
	return defaultUpperMiB
}
