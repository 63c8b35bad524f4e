package controlplane

import (
	"context"
	"crypto/rand"
	"errors"
	"maps"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/time/rate"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/scheduler"
	"github.com/dsec-dev/dsec/internal/store"
)

const (
	maxLabels      = 64
	maxEnv         = 256
	maxValueLen    = 4096
	createDeadline = 2 * time.Minute
)

var labelKey = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$`)
var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// validateEnv checks a sandbox's environment (a create's, a grading's).
func validateEnv(env map[string]string) error {
	if len(env) > maxEnv {
		return errdefs.New(errdefs.Invalid, api.CodeTooManyEnv, "at most %d environment variables", maxEnv)
	}
	for k, v := range env {
		if !envKey.MatchString(k) || len(v) > maxValueLen || strings.IndexByte(v, 0) >= 0 {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidEnv, "environment variable %q is not valid", k)
		}
	}
	return nil
}

// newID returns a sandbox ID: "sb-" and a lower-case ULID, so IDs sort by
// creation time and are valid store keys.
func newID() string {
	return "sb-" + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String())
}

// validate checks a create request and fills in defaults.
func (m *Manager) validate(req *api.CreateSandboxRequest) error {
	l := &m.lim
	if req.Tier == "" {
		req.Tier = l.DefaultTier
	}
	if !sandbox.KnownTier(req.Tier) {
		return errdefs.New(errdefs.Invalid, api.CodeUnknownTier, "unknown tier %q (tiers: function, container, microvm, vm)", req.Tier)
	}
	switch {
	case req.Image != "" && len(req.Layers) > 0:
		return errdefs.New(errdefs.Invalid, api.CodeImageAndLayers, "name an image or its layers, not both")
	case req.Image == "" && len(req.Layers) == 0:
		req.Image = l.DefaultImages[req.Tier]
		if req.Image == "" {
			return errdefs.New(errdefs.Invalid, api.CodeImageRequired, "the %s tier has no default image: name one", req.Tier)
		}
	}
	if err := validateNetwork(req); err != nil {
		return err
	}
	if err := m.validatePhases(req); err != nil {
		return err
	}
	if err := sandbox.CheckCapsAndExecutables(req); err != nil {
		return err
	}
	if req.CPU < 0 || req.CPU > l.MaxCPU {
		return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "cpu must be between 0 and %g", l.MaxCPU)
	}
	if req.CPU == 0 {
		req.CPU = l.DefaultCPU
	}
	ints := []struct {
		name     string
		v        *int
		def, max int
	}{
		{"memory_mb", &req.MemoryMB, l.DefaultMemoryMB, l.MaxMemoryMB},
		{"disk_mb", &req.DiskMB, l.DefaultDiskMB, l.MaxDiskMB},
		{"timeout_s", &req.TimeoutS, l.DefaultTimeoutS, l.MaxTimeoutS},
	}
	for _, b := range ints {
		if *b.v < 0 || *b.v > b.max {
			return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "%s must be between 0 and %d", b.name, b.max)
		}
		if *b.v == 0 {
			*b.v = b.def
		}
	}
	if len(req.Labels) > maxLabels {
		return errdefs.New(errdefs.Invalid, api.CodeTooManyLabels, "at most %d labels", maxLabels)
	}
	for k, v := range req.Labels {
		if !labelKey.MatchString(k) || len(v) > maxValueLen {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidLabel, "label %q: keys are 1–128 letters, digits, '.', '_', '/', '-'; values at most %d bytes", k, maxValueLen)
		}
	}
	if err := validateEnv(req.Env); err != nil {
		return err
	}
	return nil
}

// admit applies the owner's rate limit and sandbox cap, reserving a slot;
// release must be called when the create finishes.
func (m *Manager) admit(owner string) (release func(), err error) {
	m.limMu.Lock()
	defer m.limMu.Unlock()
	lim := m.limiters[owner]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(m.lim.CreatesPerSecond), m.lim.CreateBurst)
		m.limiters[owner] = lim
	}
	r := lim.Reserve()
	if d := r.Delay(); d > 0 {
		r.Cancel()
		return nil, &errdefs.Error{Class: errdefs.RateLimited, Code: api.CodeRateLimited,
			Msg: "too many sandbox creates: slow down", RetryAfter: d}
	}
	if m.cache.liveCount(owner)+m.creating[owner] >= m.lim.MaxSandboxesPerOwner {
		r.Cancel()
		return nil, &errdefs.Error{Class: errdefs.RateLimited, Code: api.CodeTooManySandboxes,
			Msg: "this token already has the maximum number of live sandboxes; delete some first", RetryAfter: time.Second}
	}
	m.creating[owner]++
	return func() {
		m.limMu.Lock()
		m.creating[owner]--
		if m.creating[owner] == 0 {
			delete(m.creating, owner)
		}
		m.limMu.Unlock()
	}, nil
}

// Create creates a sandbox for owner and returns it running.
func (m *Manager) Create(ctx context.Context, owner string, req api.CreateSandboxRequest) (sb api.Sandbox, err error) {
	if req.RequestID != "" {
		return m.createOnce(ctx, owner, req)
	}
	rec, err := m.create(ctx, owner, req, createOpts{})
	return rec.Sandbox, err
}

// createOpts are what a resume or a fork adds to a create.
type createOpts struct {
	// id, if set, is the sandbox's ID (a resume behind the same ID).
	id string
	// resumed: the trajectory exists and the new sandbox continues it
	// (no head is begun and no create step logged; the caller replays).
	resumed     bool
	incarnation int
	// node, if set, is preferred (fork siblings share their snapshot's
	// pages there).
	node string
	// await, if set, is waited for before the sandbox is made on another
	// node than node (a fork's snapshot is in node's layer cache before
	// its upload to the blob store ends).
	await func(context.Context) error
	// parent and parentStep make a fork child's trajectory.
	parent     string
	parentStep int
	// recreate: id's record exists (a preempted sandbox); avoid is the
	// node it was lost on.
	recreate bool
	avoid    string
}

func (m *Manager) create(ctx context.Context, owner string, req api.CreateSandboxRequest, o createOpts) (out store.SandboxRecord, err error) {
	start := time.Now()
	defer func() { m.obs.Created(req.Tier, time.Since(start), err) }()
	if err := m.validate(&req); err != nil {
		return out, err
	}
	if err := m.validateTrajectory(ctx, owner, &req); err != nil {
		return out, err
	}
	release, err := m.admit(owner)
	if err != nil {
		return out, err
	}
	defer release()
	var img image.Resolved
	if len(req.Layers) > 0 {
		img, err = m.images.Compose(ctx, req.Layers, nil)
	} else {
		img, err = m.images.Resolve(ctx, req.Image)
	}
	if err != nil {
		return out, err
	}
	if !img.Supports(req.Tier) {
		return out, errdefs.New(errdefs.Invalid, api.CodeImageTierMismatch, "image %s is for tiers %v, not %s", req.Image, img.Manifest.Tiers, req.Tier)
	}
	imgName := img.Name
	if imgName == "" {
		imgName = img.ID
	}
	ref := noderpc.ImageRef{ID: img.ID, Name: imgName, Source: img.Source()}
	var layerIDs []string
	for _, l := range img.Layers {
		ref.Layers = append(ref.Layers, noderpc.LayerRef{ID: l.ID, Manifest: l.Manifest})
		layerIDs = append(layerIDs, l.ID)
	}
	node, placed, err := m.view.pick(scheduler.Request{Tier: req.Tier, CPU: req.CPU, MemoryMB: req.MemoryMB, Prefer: o.node, Avoid: o.avoid}, m.opt.NodeStale)
	if err != nil {
		return out, err
	}
	defer func() { placed(err == nil) }()
	if o.await != nil && node != o.node {
		if err := o.await(ctx); err != nil {
			return out, err
		}
	}

	now := time.Now().UTC()
	id := o.id
	if id == "" {
		id = newID()
	}
	rec := store.SandboxRecord{
		Sandbox: api.Sandbox{
			ID: id, Tier: req.Tier, Image: imgName, ImageID: img.ID, State: api.StatePending, Node: node,
			CPU: req.CPU, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, TimeoutS: req.TimeoutS,
			Labels: maps.Clone(req.Labels), Network: req.Network, CreatedAt: now, ExpiresAt: now.Add(time.Duration(req.TimeoutS) * time.Second),
			Phases: req.Phases, Capabilities: req.Capabilities,
		},
		StateSince: now, Creator: m.leases.name, CreatorRun: m.leases.incarnation,
		Owner: owner, Env: maps.Clone(req.Env), ImageSource: img.Source(), Layers: layerIDs,
		SecretEnv: req.SecretEnv, ResumeOnPreempt: req.ResumeOnPreempt, FromSnapshot: req.FromSnapshot,
	}
	for _, l := range img.Manifest.Layers {
		if l.Role == RoleState {
			rec.BaseState = append(rec.BaseState, l.ID)
		}
	}
	var logged *startLog
	if req.Trajectory != "" {
		rec.Trajectory, rec.Incarnation = req.Trajectory, max(o.incarnation, 1)
		if !o.resumed {
			// The trajectory's head and its create step are written
			// while the record and the sandbox are made: their round
			// trips overlap, and the create answers after all of them.
			logged = m.startLogging(ctx, owner, rec, req, img, o)
			defer func() {
				if err != nil {
					logged.undo(m, rec)
				}
			}()
		}
	}
	if len(rec.Phases) > 0 {
		rec.Phase = rec.Phases[0].Name
		rec.PhaseHistory = []api.PhaseChange{{Phase: rec.Phase, At: now}}
	}
	// The record goes first: if this process dies before the node has the
	// sandbox, reconciliation finds the pending record and cleans up.
	m.trackCreate(rec.ID, true)
	defer m.trackCreate(rec.ID, false)
	if o.recreate {
		// A preempted sandbox comes back behind its ID: its record
		// (failed by nobody: the caller holds it) moves to the new node.
		if err := m.recreateRecord(ctx, rec); err != nil {
			return out, err
		}
	} else {
		rev, err := m.st.CreateSandbox(ctx, rec)
		if err != nil {
			if !errors.Is(err, errdefs.Conflict) {
				m.refresh(rec.ID)
			}
			return out, err
		}
		m.cache.apply(rec, rev)
		m.event(rec, "", "")
	}

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createDeadline)
	defer cancel()
	err = m.nodes.Create(cctx, node, noderpc.CreateRequest{
		ID: rec.ID, Tier: rec.Tier, CPU: rec.CPU, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB, Env: rec.Env,
		Image: ref, Network: rec.Network, Phases: rec.Phases, Capabilities: rec.Capabilities,
	})
	if err != nil {
		// The node may hold a half-made sandbox if the call timed out.
		if errdefs.ClassOf(err) == errdefs.DeadlineExceeded || errdefs.ClassOf(err) == errdefs.Unavailable {
			m.destroyOnNode(cctx, node, rec.ID)
		}
		if retryable(err) {
			// Nothing of it is left: the record goes too, and the
			// caller is told when to try again.
			m.forget(cctx, rec, "create refused: "+errdefs.MessageOf(err))
			return out, withRetryHint(err)
		}
		m.fail(cctx, rec.ID, "create failed: "+errdefs.MessageOf(err))
		return out, err
	}
	if o.resumed {
		// Pending until the replay is done: calls meanwhile are told to
		// retry (running), so none interleaves with the replay.
		out, _, _ = m.cache.get(rec.ID)
		return out, nil
	}
	if err = logged.wait(); err != nil {
		// A sandbox whose trajectory has no head or no start (a name in
		// use, the log unreachable) is never seen running: it goes.
		m.destroyOnNode(cctx, node, rec.ID)
		m.forget(cctx, rec, "trajectory: "+errdefs.MessageOf(err))
		return out, err
	}
	out, err = m.transition(cctx, rec.ID, api.StatePending, api.StateRunning, "")
	if err != nil {
		// Deleted while being created: the deleter destroys it.
		return out, err
	}
	return out, nil
}

func (m *Manager) trackCreate(id string, on bool) {
	m.inflightMu.Lock()
	defer m.inflightMu.Unlock()
	if on {
		m.creates[id] = struct{}{}
	} else {
		delete(m.creates, id)
	}
}

func (m *Manager) createInFlight(id string) bool {
	m.inflightMu.Lock()
	defer m.inflightMu.Unlock()
	_, ok := m.creates[id]
	return ok
}

// validateNetwork checks a request's network policy: its syntax, and that
// the tier has a network if it asks for egress.
func validateNetwork(req *api.CreateSandboxRequest) error {
	p, err := network.FromAPI(req.Network)
	if err != nil {
		return err
	}
	if p.Mode != network.ModeNone && req.Tier == api.TierFunction {
		return errdefs.New(errdefs.Unsupported, api.CodeTierHasNoNetwork, "the function tier has no network: egress %q needs the container tier or a VM tier", req.Network.Egress)
	}
	return nil
}

// retryable reports whether a node's answer to a create means that the
// create made nothing and may succeed later: the node refused it for
// now (its admission, RateLimited) or could not start it and undid it
// (Unavailable). The node's Create promises both; for an unreachable
// node the control plane has also asked it to destroy the sandbox.
func retryable(err error) bool {
	c := errdefs.ClassOf(err)
	return c == errdefs.RateLimited || c == errdefs.Unavailable
}

// withRetryHint gives a retryable error a retry hint (the API's
// Retry-After) if the node did not: clients retry a 503 only when told
// when.
func withRetryHint(err error) error {
	if errdefs.RetryAfterOf(err) > 0 {
		return err
	}
	var e *errdefs.Error
	if errors.As(err, &e) {
		c := *e
		c.RetryAfter = time.Second
		return &c
	}
	return &errdefs.Error{Class: errdefs.ClassOf(err), Code: errdefs.CodeOf(err), Msg: errdefs.MessageOf(err), Cause: err, RetryAfter: time.Second}
}

// forget removes the record of a create that made nothing: the caller
// never saw its ID and retries with a new one, so a failed record would
// only be noise in listings. The lifecycle stream still says it failed.
func (m *Manager) forget(ctx context.Context, rec store.SandboxRecord, reason string) {
	if err := m.st.PurgeSandbox(ctx, rec.ID); err != nil {
		m.log.Warn("removing the record of a refused create", "sandbox", rec.ID, "err", err)
		m.fail(ctx, rec.ID, reason)
		return
	}
	// The store's watch removes it too, once it delivers the purge.
	m.cache.remove(rec.ID, math.MaxUint64)
	rec.State = api.StateFailed
	m.event(rec, api.StatePending, reason)
}
