package controlplane

import (
	"context"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/store"
)

// Staged permissions: a task's phases are checked here, at create, so
// that a node only ever applies valid ones; the current phase lives in
// the sandbox's record, and only SetPhase (the API caller) changes it.

const maxPhases = 16

var phaseName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// validatePhases checks req.Phases and normalises them.
func (m *Manager) validatePhases(req *api.CreateSandboxRequest) error {
	if len(req.Phases) == 0 {
		return nil
	}
	if req.Network != nil {
		return errdefs.New(errdefs.Invalid, api.CodeNetworkAndPhases, "with phases, each phase has its own network: leave the sandbox's network out")
	}
	if len(req.Phases) > maxPhases {
		return errdefs.New(errdefs.Invalid, api.CodeTooManyPhases, "at most %d phases", maxPhases)
	}
	seen := map[string]bool{}
	for i := range req.Phases {
		p := &req.Phases[i]
		if !phaseName.MatchString(p.Name) || seen[p.Name] {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidPhase, "phase %d: names are 1–32 letters, digits, '_' or '-', each used once (%q)", i, p.Name)
		}
		seen[p.Name] = true
		check := api.CreateSandboxRequest{Tier: req.Tier, Network: p.Network}
		if err := validateNetwork(&check); err != nil {
			return errdefs.Wrap(errdefs.ClassOf(err), errdefs.CodeOf(err), err, "phase %s", p.Name)
		}
		if p.Writable != nil {
			clean := make([]string, 0, len(p.Writable))
			for _, w := range p.Writable {
				c := path.Clean(w)
				if !path.IsAbs(w) || strings.ContainsRune(w, 0) || len(w) > 4096 {
					return errdefs.New(errdefs.Invalid, api.CodeInvalidPhase, "phase %s: writable paths are absolute (%q)", p.Name, w)
				}
				clean = append(clean, c)
			}
			slices.Sort(clean)
			p.Writable = slices.Compact(clean)
		}
		if req.Tier == api.TierFunction && p.User != "" && p.User != "root" {
			return errdefs.New(errdefs.Unsupported, api.CodeTierHasNoUsers, "phase %s: the function tier has no users", p.Name)
		}
		if _, _, err := sandbox.ParseUser(p.User); err != nil {
			return errdefs.Within(errdefs.Invalid, api.CodeInvalidPhase, err, "phase %s", p.Name)
		}
		if p.CPU < 0 || p.CPU > m.lim.MaxCPU || p.MemoryMB < 0 || p.MemoryMB > m.lim.MaxMemoryMB {
			return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "phase %s: cpu must be between 0 and %g, memory_mb between 0 and %d", p.Name, m.lim.MaxCPU, m.lim.MaxMemoryMB)
		}
	}
	return nil
}

// phaseLocks serialise phase changes of a sandbox (striped by ID: phase
// changes are rare, sandboxes many).
var phaseLocks [64]sync.Mutex

func phaseLock(id string) *sync.Mutex {
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return &phaseLocks[h%uint32(len(phaseLocks))]
}

// SetPhase moves a running sandbox of owner to its phase name: forward
// only, unless back allows an earlier one. The node ends every process
// of the earlier phase and applies the new one before the record says
// so; a failure leaves the record at the old phase.
func (m *Manager) SetPhase(ctx context.Context, owner, id string, req api.SetPhaseRequest) (api.Sandbox, error) {
	mu := phaseLock(id)
	mu.Lock()
	defer mu.Unlock()
	rec, err := m.running(owner, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if m.fastForwardPast(ctx, rec, api.TrajectoryStep{Kind: api.KindPhase, Phase: &req}) {
		// A resumed sandbox whose log moved to this phase next: done.
		return rec.Sandbox, nil
	}
	if len(rec.Phases) == 0 {
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, api.CodeNoPhases, "sandbox %s was created without phases", id)
	}
	to := slices.IndexFunc(rec.Phases, func(p api.Phase) bool { return p.Name == req.Phase })
	if to < 0 {
		return api.Sandbox{}, errdefs.New(errdefs.Invalid, api.CodeUnknownPhase, "sandbox %s has no phase %q", id, req.Phase)
	}
	from := slices.IndexFunc(rec.Phases, func(p api.Phase) bool { return p.Name == rec.Phase })
	switch {
	case to == from:
		return rec.Sandbox, nil
	case to < from && !req.Back:
		return api.Sandbox{}, errdefs.New(errdefs.Conflict, api.CodePhaseBackwards, "sandbox %s is in phase %s, after %s: going back needs back=true", id, rec.Phase, req.Phase)
	}
	var out store.SandboxRecord
	err = m.stepped(ctx, rec, api.TrajectoryStep{Kind: api.KindPhase, Phase: &req}, func(int) error {
		if err := m.nodes.SetPhase(ctx, rec.Node, id, rec.Phases[to]); err != nil {
			if errdefs.CodeOf(err) == api.CodePhaseChangeFailed {
				// The node destroyed the sandbox rather than leave a phase
				// applied in part (phase_change_busy leaves it running).
				m.fail(context.WithoutCancel(ctx), id, api.CodePhaseChangeFailed)
			}
			return err
		}
		out, err = m.mutate(ctx, id, func(r *store.SandboxRecord) (bool, error) {
			r.Phase = req.Phase
			r.PhaseHistory = append(r.PhaseHistory, api.PhaseChange{Phase: req.Phase, At: time.Now().UTC()})
			return true, nil
		})
		return err
	})
	if err != nil {
		return api.Sandbox{}, err
	}
	return out.Sandbox, nil
}

// maxAuditEvents bounds one page of GET /v1/sandboxes/{id}/events.
const maxAuditEvents = 10000

// AuditEvents returns what the monitor saw in a sandbox of owner (running
// or ended), oldest first: up to limit events after the first skip.
func (m *Manager) AuditEvents(ctx context.Context, owner, id string, skip, limit int) ([]api.AuditEvent, error) {
	if _, err := m.owned(owner, id); err != nil {
		return nil, err
	}
	if skip < 0 || limit < 0 || limit > maxAuditEvents {
		return nil, errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "skip must be ≥ 0 and limit between 0 and %d", maxAuditEvents)
	}
	if limit == 0 {
		limit = 1000
	}
	return m.st.AuditEvents(ctx, id, skip, limit)
}

// Integrity reports what happened in a sandbox of owner, from its record
// and the monitor's events.
func (m *Manager) Integrity(ctx context.Context, owner, id string) (api.IntegrityReport, error) {
	rec, err := m.owned(owner, id)
	if err != nil {
		return api.IntegrityReport{}, err
	}
	r := api.IntegrityReport{Sandbox: id, Phases: rec.PhaseHistory, Rules: []api.RuleCount{}, BySeverity: map[string]int{},
		SealedGrading: len(rec.Grades) > 0, Grades: slices.Clone(rec.Grades)}
	if r.Grades == nil {
		r.Grades = []api.GradeSummary{}
	}
	if r.Phases == nil {
		r.Phases = []api.PhaseChange{}
	}
	r.Monitored, r.GuestEnforced = oversight(m.view.list(), rec.Node, rec.Tier)
	byRule := map[string]*api.RuleCount{}
	for skip := 0; ; {
		evs, err := m.st.AuditEvents(ctx, id, skip, maxAuditEvents)
		if err != nil {
			return api.IntegrityReport{}, err
		}
		for _, e := range evs {
			r.Events++
			if e.Verdict == "denied" {
				r.Denied++
			}
			if e.Rule == "" {
				continue
			}
			r.BySeverity[e.Severity]++
			c := byRule[e.Rule]
			if c == nil {
				c = &api.RuleCount{Rule: e.Rule, Severity: e.Severity, First: e.Time}
				byRule[e.Rule] = c
			}
			c.Count++
			if e.Severity == "high" || e.Severity == "critical" {
				r.Suspicious = true
			}
		}
		if len(evs) < maxAuditEvents {
			break
		}
		skip += len(evs)
	}
	for _, c := range byRule {
		r.Rules = append(r.Rules, *c)
	}
	slices.SortFunc(r.Rules, func(a, b api.RuleCount) int { return a.First.Compare(b.First) })
	return r, nil
}

// oversight says, from its node's report, whether a sandbox of tier on
// node was watched by the node's monitor (which does not see inside a
// guest kernel) and which parts of its phases its guest enforced.
func oversight(nodes []api.Node, node, tier string) (monitored bool, guestEnforced []string) {
	guestEnforced = []string{}
	for _, n := range nodes {
		if n.ID != node {
			continue
		}
		monitored = n.Monitor == "on"
		for _, t := range n.Tiers {
			if t.Name == tier {
				monitored = monitored && !t.GuestKernel
				guestEnforced = append(guestEnforced, t.GuestEnforced...)
			}
		}
	}
	return monitored, guestEnforced
}

// followGrace is how long FollowAuditEvents keeps following after the
// sandbox ended: its last events are still on their way from the node.
const followGrace = 2 * time.Second

// FollowAuditEvents calls fn with a sandbox's audit events after the
// first skip, then with new ones as the monitor sees them, until ctx ends
// or followGrace after the sandbox stopped.
func (m *Manager) FollowAuditEvents(ctx context.Context, owner, id string, skip int, fn func(api.AuditEvent) error) error {
	if _, err := m.owned(owner, id); err != nil {
		return err
	}
	if skip < 0 {
		return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "skip must be ≥ 0")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rec, _, ok := m.cache.get(id)
			if !ok || rec.State == api.StateStopped || rec.State == api.StateFailed {
				select {
				case <-ctx.Done():
				case <-time.After(followGrace):
					cancel()
				}
				return
			}
		}
	}()
	return m.st.FollowAuditEvents(ctx, id, skip, fn)
}
