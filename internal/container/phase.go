package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
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
// cannot point one elsewhere. /dev and /dev/shm, tmpfs mounts of the
// sandbox's, are read-only in a phase with writable paths (/dev/shm
// stays writable if the phase names it); /proc is unaffected.

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

// phaseAt names the phase the sandbox was in at t (an audit event's
// time).
func (s *Sandbox) phaseAt(t time.Time) string {
	if name, ok := s.phases.at(t); ok {
		return name
	}
	return s.Phase()
}

// phaseHistory is when the sandbox's recent phases began: the recorder
// handles an event after it happened (later still under load), and a
// phase change in between must not relabel it. Safe for concurrent use.
type phaseHistory struct {
	mu      sync.Mutex
	changes []phaseChange // oldest first
}

type phaseChange struct {
	at   time.Time
	name string
}

// maxPhaseChanges bounds the history: events are handled within seconds,
// phases last longer.
const maxPhaseChanges = 8

// begin records that phase to followed from at on.
func (h *phaseHistory) begin(from, to string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.changes) == 0 {
		h.changes = append(h.changes, phaseChange{name: from}) // since the start
	}
	h.changes = append(h.changes, phaseChange{at: at, name: to})
	if n := len(h.changes) - maxPhaseChanges; n > 0 {
		h.changes = slices.Delete(h.changes, 0, n)
	}
}

// at names the phase at t: false before any change (the current phase
// then is the only one). An event older than every change kept gets the
// oldest kept.
func (h *phaseHistory) at(t time.Time) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.changes) == 0 {
		return "", false
	}
	for i := len(h.changes) - 1; i > 0; i-- {
		if !t.Before(h.changes[i].at) {
			return h.changes[i].name, true
		}
	}
	return h.changes[0].name, true
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
		return errdefs.New(errdefs.Conflict, api.CodeNoPhases, "sandbox %s was created without phases", s.id)
	}
	if err := sandbox.CheckPhase(s.state.Spec, &p); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.rt.opt.PhaseTimeout)
	defer cancel()
	// Until the earlier phase's processes are gone nothing has changed,
	// and a failure leaves the sandbox running in its old phase (Freeze
	// and Thaw never leave it frozen). A failure while applying the new
	// phase leaves it half in each: the node destroys it
	// (phase_change_failed).
	if err := s.cg.Freeze(ctx); err != nil {
		return phaseBusy(s.id, old.Name, p.Name, err)
	}
	if err := s.endCommands(ctx); err != nil {
		if terr := s.cg.Thaw(ctx); terr != nil {
			err = errors.Join(err, terr)
		}
		if errors.Is(err, cgroups.ErrGone) {
			return errdefs.Wrap(errdefs.Internal, api.CodePhaseChangeFailed, err, "sandbox %s: moving to phase %s: its agent is gone", s.id, p.Name)
		}
		return phaseBusy(s.id, old.Name, p.Name, err)
	}
	err := s.rt.applyPhase(ctx, s, p, old)
	if errdefs.ClassOf(err) == errdefs.Invalid {
		// Refused before anything changed (see applyPhase).
		if terr := s.cg.Thaw(ctx); terr != nil {
			return errdefs.Wrap(errdefs.Internal, api.CodePhaseChangeFailed, errors.Join(err, terr), "sandbox %s: moving to phase %s", s.id, p.Name)
		}
		return err
	}
	if err == nil {
		st := *s.state
		st.Phase = &p
		if err = st.write(s.dir); err == nil {
			s.state = &st
			// Frozen until the Thaw below: nothing of the sandbox's
			// happens between the old phase's end and this time.
			s.phases.begin(old.Name, p.Name, time.Now())
		}
	}
	if terr := s.cg.Thaw(ctx); err == nil {
		err = terr
	}
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, api.CodePhaseChangeFailed, err, "sandbox %s: moving to phase %s", s.id, p.Name)
	}
	return nil
}

// phaseBusy is the error of a phase change that could not end the
// earlier phase's processes in time: retryable, the sandbox running on
// in its old phase.
func phaseBusy(id, old, to string, err error) error {
	e := errdefs.Wrap(errdefs.Unavailable, api.CodePhaseChangeBusy, err,
		"sandbox %s: could not stop the processes of phase %s in time to move to phase %s; it is still running in phase %s", id, old, to, old)
	e.RetryAfter = time.Second
	return e
}

// endCommands kills every process of the (frozen) sandbox but its agent
// and waits until they are gone from its cgroup.
func (s *Sandbox) endCommands(ctx context.Context) error {
	// The caller holds phaseMu: the phase is read here, not by Phase.
	phase := ""
	if s.state.Phase != nil {
		phase = s.state.Phase.Name
	}
	err := s.cg.KillExcept(ctx, s.state.Pid, func(pid int) {
		s.recordProcess(phase, monitor.KindPhaseKill, pid)
	})
	if err != nil {
		return fmt.Errorf("ending the processes of phase %s: %w", phase, err)
	}
	return nil
}

// applyPhase applies p (after old, nil at create) to sb: writable
// paths, network, executables, limits. Writable paths come first: a
// path refused there (errdefs.Invalid) has changed nothing, which
// SetPhase relies on; any later failure leaves p applied in part.
func (r *Runtime) applyPhase(ctx context.Context, sb *Sandbox, p api.Phase, old *api.Phase) error {
	policy, err := network.FromAPI(p.Network)
	if err != nil {
		return err
	}
	if sb.state.Netns == "" && !policy.Isolated() {
		return errdefs.New(errdefs.Internal, api.CodePhaseNetworkUnavailable, "phase %s has a network, and the sandbox was made without one", p.Name)
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
	// At create (old nil) Acquire applied the first phase's policy.
	if sb.state.Netns != "" && old != nil && !equalPolicy(old.Network, p.Network) {
		if err := r.opt.Network.SetPolicy(ctx, sb.id, policy); err != nil {
			return partly(err)
		}
	}
	if old == nil || p.Executables != nil || old.Executables != nil {
		if err := r.setExecutables(sb, p); err != nil {
			return partly(err)
		}
	}
	if err := sb.cg.Update(r.phaseLimits(sb.state.Spec, p)); err != nil {
		return partly(err)
	}
	return nil
}

// partly marks an error after part of a phase was applied as internal,
// whatever its class: the phase was valid, and applying it broke.
func partly(err error) error {
	if errdefs.ClassOf(err) == errdefs.Invalid {
		return errdefs.Wrap(errdefs.Internal, api.CodePhaseChangeFailed, err, "%s", errdefs.MessageOf(err))
	}
	return err
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
		oldWritable = rootWritable(old.Writable)
	}
	return sys.InMountNS(ns, func() error {
		err := sys.ReplaceWritable(oldWritable, rootWritable(p.Writable), r.opt.HostUID, r.opt.HostGID)
		if ue := (*sys.UnbindableError)(nil); errors.As(err, &ue) {
			return errdefs.Wrap(errdefs.Invalid, api.CodePhaseWritablePath, ue.Err, "phase %s: writable path %s", p.Name, ue.Path)
		}
		if err != nil {
			return err
		}
		// /dev and /dev/shm are tmpfs mounts of their own, which the
		// sandbox's root owns: writable, they were storage no writable
		// list covered. A phase with a list has /dev read-only, and
		// /dev/shm too unless the list names it.
		whole := sandbox.WholeRootWritable(p)
		for _, m := range []struct {
			path     string
			writable bool
		}{{devPath, whole}, {shmPath, whole || slices.Contains(p.Writable, shmPath)}} {
			if err := sys.SetMountReadOnly(m.path, !m.writable); err != nil {
				return err
			}
		}
		return nil
	})
}

// The sandbox's own file systems under /dev (guest.SetupSandbox).
const (
	devPath = "/dev"
	shmPath = "/dev/shm"
)

// rootWritable is writable without /dev/shm, a mount of its own that
// setWritable makes writable or not (nil stays nil: the whole root).
func rootWritable(writable []string) []string {
	if writable == nil || !slices.Contains(writable, shmPath) {
		return writable
	}
	out := []string{}
	for _, w := range writable {
		if w != shmPath {
			out = append(out, w)
		}
	}
	return out
}
