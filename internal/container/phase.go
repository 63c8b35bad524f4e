package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Staged permissions (sandbox.Phaser). A phase change freezes the
// sandbox's cgroup, kills every process in it but the agent (a root
// daemon, a background job, a socket or a writable descriptor of the
// earlier phase ends with its process: nothing a phase started keeps a
// privilege into the next), applies the new phase's network policy
// (nftables), writable paths (mounts) and limits (cgroups) from the host,
// records it and thaws. The commands the agent starts afterwards run as
// the phase's user.
//
// Writable paths: the root mount is made read-only and each writable
// path becomes a writable bind mount of itself on top of it, made from
// the host in the sandbox's mount namespace; paths are resolved without
// following symlinks and without leaving the root mount, so a sandbox
// cannot point one elsewhere. /dev, /dev/shm and /proc are separate
// mounts and unaffected.

var _ sandbox.Phaser = (*Sandbox)(nil)

// Phase implements sandbox.Phaser.
func (s *Sandbox) Phase() string {
	s.phaseMu.RLock()
	defer s.phaseMu.RUnlock()
	if p := s.state.Phase; p != nil {
		return p.Name
	}
	return ""
}

// hasNetwork reports whether the sandbox has a network of the node's
// network manager (one without network access has a namespace of its own).
func (s *Sandbox) hasNetwork() bool {
	s.phaseMu.RLock()
	defer s.phaseMu.RUnlock()
	return s.state.Netns != ""
}

// commandPhase is the current phase (nil without phases), for a command
// about to start.
func (s *Sandbox) commandPhase() *api.Phase {
	s.phaseMu.RLock()
	defer s.phaseMu.RUnlock()
	return s.state.Phase
}

// SetPhase implements sandbox.Phaser.
func (s *Sandbox) SetPhase(ctx context.Context, p api.Phase) error {
	s.phaseMu.Lock()
	defer s.phaseMu.Unlock()
	old := s.state.Phase
	if old == nil {
		return errdefs.New(errdefs.Conflict, "no_phases", "sandbox %s was created without phases", s.id)
	}
	if err := sandbox.CheckPhase(s.state.Spec, &p); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.cg.Freeze(ctx); err != nil {
		return err
	}
	err := s.endCommands(ctx)
	if err == nil {
		err = s.rt.applyPhase(ctx, s, p, old)
	}
	if err == nil {
		st := *s.state
		st.Phase = &p
		if err = st.write(s.dir); err == nil {
			s.state = &st
		}
	}
	if terr := s.cg.Thaw(ctx); err == nil {
		err = terr
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, "phase_change_failed", err, "sandbox %s: moving to phase %s", s.id, p.Name)
	}
	return nil
}

// endCommands kills every process of the (frozen) sandbox but its agent
// and waits until they are gone from its cgroup.
func (s *Sandbox) endCommands(ctx context.Context) error {
	agent := s.state.Pid
	var seen []int // recorded
	// The caller holds phaseMu: the phase is read here, not by Phase.
	phase := ""
	if s.state.Phase != nil {
		phase = s.state.Phase.Name
	}
	for {
		procs, err := s.cg.Procs()
		if err != nil {
			return err
		}
		if !slices.Contains(procs, agent) {
			return errors.New("its agent is gone")
		}
		if len(procs) == 1 {
			return nil
		}
		for _, pid := range procs {
			if pid == agent {
				continue
			}
			// Through a pidfd opened while the pid is listed: a reused
			// pid is not signalled (a new process would not be in the
			// group, and the group is frozen: nothing forks).
			fd, err := sys.OpenPidfd(pid)
			if err != nil {
				continue // gone already
			}
			if !slices.Contains(seen, pid) {
				seen = append(seen, pid)
				s.recordProcess(phase, monitor.KindPhaseKill, pid)
			}
			_ = fd.Kill()
			_ = fd.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("processes of the earlier phase are left: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// applyPhase applies p (after old, nil at create) to sb: network,
// writable paths, limits.
func (r *Runtime) applyPhase(ctx context.Context, sb *Sandbox, p api.Phase, old *api.Phase) error {
	policy, err := network.FromAPI(p.Network)
	if err != nil {
		return err
	}
	switch {
	case sb.state.Netns != "":
		// At create (old nil) Acquire applied the first phase's policy.
		if old != nil && !equalPolicy(old.Network, p.Network) {
			if err := r.opt.Network.SetPolicy(ctx, sb.id, policy); err != nil {
				return err
			}
		}
	case !policy.Isolated():
		return errdefs.New(errdefs.Internal, "phase_network_unavailable", "phase %s has a network, and the sandbox was made without one", p.Name)
	}
	// A new sandbox's root is all writable already.
	var changed bool
	if old == nil {
		changed = !sandbox.WholeRootWritable(p)
	} else {
		changed = !slices.Equal(old.Writable, p.Writable) || (old.Writable == nil) != (p.Writable == nil)
	}
	if changed {
		if err := r.setWritable(sb, p, old); err != nil {
			return err
		}
	}
	if old == nil || p.Executables != nil || old.Executables != nil {
		if err := r.setExecutables(sb, p); err != nil {
			return err
		}
	}
	return sb.cg.Update(r.phaseLimits(sb.state.Spec, p))
}

func equalPolicy(a, b *api.NetworkPolicy) bool {
	pa, _ := network.FromAPI(a)
	pb, _ := network.FromAPI(b)
	return fmt.Sprint(pa) == fmt.Sprint(pb)
}

// phaseLimits are spec's limits with p's overrides.
func (r *Runtime) phaseLimits(spec sandbox.Spec, p api.Phase) cgroups.Limits {
	if p.CPU > 0 {
		spec.CPU = p.CPU
	}
	if p.MemoryMB > 0 {
		spec.MemoryMB = p.MemoryMB
	}
	return r.limits(spec)
}

// setWritable makes only p's writable paths writable, from a thread in
// the sandbox's mount namespace.
func (r *Runtime) setWritable(sb *Sandbox, p api.Phase, old *api.Phase) error {
	pid := sb.state.Pid
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	// The namespace is the sandbox's if its agent is still in its
	// cgroup after the open (a reused pid would not be).
	if procs, err := sb.cg.Procs(); err != nil || !slices.Contains(procs, pid) {
		return errors.New("its agent is gone")
	}
	var oldWritable []string
	if old != nil {
		oldWritable = old.Writable
	}
	return sys.InMountNS(ns, func() error {
		err := sys.ReplaceWritable(oldWritable, p.Writable, r.opt.HostUID, r.opt.HostGID)
		if ue := (*sys.UnbindableError)(nil); errors.As(err, &ue) {
			return errdefs.Wrap(errdefs.Invalid, "phase_writable_path", ue.Err, "phase %s: writable path %s", p.Name, ue.Path)
		}
		return err
	})
}
