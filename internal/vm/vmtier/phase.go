package vmtier

import (
	"context"
	"errors"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Staged permissions (sandbox.Phaser). The host applies a phase's
// network (setNetworkPolicy); the rest is applied inside the guest by
// its agent (agentproto.OpPhase), which the node trusts there because
// the guest runs only the task's code and the VM, not the guest, is the
// isolation (api.IntegrityReport.GuestEnforced says so):
//
//   - processes: the agent kills every other process of the guest
//     (kill(-1) sweeps until none is left);
//   - writable: it makes the root read-only but for the phase's
//     writable paths, each a writable bind mount of itself resolved
//     without following symlinks (as the container tier does from the
//     host);
//   - user and capabilities: the node passes them with every exec, as
//     to a container's agent; from the first phase on, the agent sets
//     SECBIT_NOROOT so that root's commands hold only the capabilities
//     their exec names.
//
// A phase's allowed executables cannot be enforced (the host's eBPF
// monitor does not see inside a guest): a spec naming them is refused
// (executables_unenforced). A VM's vCPUs and memory are fixed at boot:
// a phase's CPU or MemoryMB different from the sandbox's is refused
// (phase_limits_unsupported).

// phaseTimeout bounds a phase change.
const phaseTimeout = 30 * time.Second

// Phase implements sandbox.Phaser.
func (s *Sandbox) Phase() string {
	s.phaseMu.RLock()
	defer s.phaseMu.RUnlock()
	if s.phase != nil {
		return s.phase.Name
	}
	return ""
}

// SetPhase implements sandbox.Phaser: the guest's agent ends the earlier
// phase's processes and applies p's writable paths, then the host
// applies p's network. Commands started meanwhile wait for it.
func (s *Sandbox) SetPhase(ctx context.Context, p api.Phase) error {
	s.phaseMu.Lock()
	defer s.phaseMu.Unlock()
	if s.phase == nil {
		return errdefs.New(errdefs.Conflict, api.CodeNoPhases, "sandbox %s was created without phases", s.id)
	}
	if err := sandbox.CheckPhase(s.spec, &p); err != nil {
		return err
	}
	if err := checkPhaseEnforceable(s.spec, p); err != nil {
		return err
	}
	if err := s.applyPhase(ctx, p); err != nil {
		return phaseError(err, "sandbox %s: moving to phase %s", s.id, p.Name)
	}
	return nil
}

// startPhase puts a new sandbox in its spec's first phase, if it has
// phases.
func (s *Sandbox) startPhase(ctx context.Context) error {
	if len(s.spec.Phases) == 0 {
		return nil
	}
	s.phaseMu.Lock()
	defer s.phaseMu.Unlock()
	if err := s.applyPhase(ctx, s.spec.Phases[0]); err != nil {
		return phaseError(err, "sandbox %s: starting in phase %s", s.id, s.spec.Phases[0].Name)
	}
	return nil
}

// applyPhase applies p in the guest, then its network, and records it.
// Preconditions: s.phaseMu must be held for writing.
func (s *Sandbox) applyPhase(ctx context.Context, p api.Phase) error {
	c, err := s.agent.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), phaseTimeout)
	defer cancel()
	if _, err := c.Phase(ctx, agentproto.PhaseArgs{Writable: p.Writable, NoRoot: true}); err != nil {
		return err
	}
	if err := s.rt.setNetworkPolicy(ctx, s, p.Network); err != nil {
		return err
	}
	st, err := readState(s.dir)
	if err != nil {
		return err
	}
	st.Phase = &p
	if err := writeState(s.dir, st); err != nil {
		return err
	}
	s.phase = &p
	return nil
}

// phaseError classifies a failed phase change: what the tier cannot do
// stays Unsupported (a network policy it has no network for), the rest
// is phase_change_failed.
func phaseError(err error, format string, args ...any) error {
	if errors.Is(err, errdefs.Unsupported) {
		return err
	}
	return errdefs.Wrap(errdefs.Internal, api.CodePhaseChangeFailed, err, format, args...)
}

// checkPhaseEnforceable refuses what a VM's phase cannot do: allowed
// executables, and limits other than the sandbox's.
func checkPhaseEnforceable(spec sandbox.Spec, p api.Phase) error {
	if p.Executables != nil {
		return errdefs.New(errdefs.Unsupported, api.CodeExecutablesUnenforced,
			"phase %s names its executables, and the microvm tier cannot enforce them (the node's monitor does not see inside a guest)", p.Name)
	}
	if p.CPU > 0 && vcpus(p.CPU) != vcpus(spec.CPU) || p.MemoryMB > 0 && p.MemoryMB != spec.MemoryMB {
		return errdefs.New(errdefs.Unsupported, api.CodePhaseLimitsUnsupported,
			"phase %s changes the sandbox's cpu or memory_mb, and a microVM's are fixed at boot", p.Name)
	}
	return nil
}
