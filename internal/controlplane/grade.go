package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/grading"
	"github.com/dsec-dev/dsec/internal/store"
	"golang.org/x/sync/errgroup"
)

// Sealed grading (POST /v1/sandboxes/{id}/grade). The grader never runs
// where the agent ran: a fresh sandbox is made from the agent's image
// with the tests layer on top, the carried part of the agent's files is
// copied in through the files API (less what grading.Filter leaves out),
// the sandbox moves to a phase where only the report directory (and /tmp)
// can be written, and the grader's command runs there. A last phase
// change ends whatever it left running. The control plane then reads
// the grading sandbox's own audit events of the run (where the node's
// monitor watches it: who wrote the report, which rules were hit), the
// report file, and decides the verdict (grading.Decide). The copy goes
// file by file through the nodes' files API, so grading works the same
// on every tier; its cost grows with the carried files, which is why
// Carry defaults to the workspace.

const (
	// maxGradeFiles and maxGradeBytes bound what a grading carries.
	maxGradeFiles = 20000
	maxGradeBytes = 1 << 30
	// maxGrades is how many gradings a record keeps.
	maxGrades = 16
	// gradeOutput is how much of the grader's output a result keeps.
	gradeOutput = 8 << 10
	// copyWorkers is how many files a grading copies at once.
	copyWorkers = 8
	// gradeLabel marks a grading sandbox with the sandbox it grades.
	gradeLabel = "dsec.grade-of"
	// auditWait bounds the wait for the grading run's audit events to
	// reach the store.
	auditWait = 10 * time.Second
)

// gradeDefaults validates req and fills in its defaults for tier.
func (m *Manager) gradeDefaults(req *api.GradeRequest, tier string) error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidGrade, format, args...)
	}
	if req.TestsLayer == "" {
		return bad("tests_layer is required: the layer with the pristine tests")
	}
	if (len(req.Cmd) == 0 || req.Cmd[0] == "") == (strings.TrimSpace(req.Command) == "") {
		return bad("the grader's command is required: cmd or command, not both")
	}
	if req.Format != "" && req.Format != "junit" {
		return errdefs.New(errdefs.Unsupported, api.CodeUnsupportedFormat, "report format %q: only junit", req.Format)
	}
	if req.ExpectedTests < 0 {
		return bad("expected_tests must be ≥ 0")
	}
	if req.TimeoutS < 0 || req.TimeoutS > m.lim.MaxExecTimeoutS {
		return errdefs.New(errdefs.Invalid, api.CodeOutOfRange, "timeout_s must be between 0 and %g", m.lim.MaxExecTimeoutS)
	}
	if req.TimeoutS == 0 {
		req.TimeoutS = 300
	}
	if req.Report == "" {
		req.Report = "/tmp/dsec-grade/junit.xml"
		if tier == api.TierFunction {
			req.Report = "/workspace/.dsec-grade/junit.xml"
		}
	}
	if req.Carry == nil {
		req.Carry = []string{"/workspace"}
	}
	if req.Sealed == nil {
		req.Sealed = []string{"/workspace/tests"}
		if tier == api.TierFunction {
			// The function tier's workspace is the sandbox's own
			// directory: a tests layer joins the read-only root instead.
			req.Sealed = []string{}
		}
	}
	if req.Cwd == "" {
		req.Cwd = "/workspace"
	}
	paths := append([]string{req.Report, req.Cwd}, req.Carry...)
	if req.Reporter != "" {
		paths = append(paths, req.Reporter)
	}
	for _, p := range append(paths, req.Sealed...) {
		if !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) || len(p) > 4096 {
			return bad("paths must be absolute and clean: %q", p)
		}
	}
	if path.Dir(req.Report) == "/" {
		return bad("the report needs a directory of its own, not /: %q", req.Report)
	}
	for _, p := range req.Protected {
		if _, err := path.Match(strings.ReplaceAll(p, "**", "*"), ""); err != nil || !path.IsAbs(p) && !strings.HasPrefix(p, "**") {
			return bad("protected pattern %q: absolute or starting with **", p)
		}
	}
	return validateEnv(req.Env)
}

// Grade runs a sealed grading of the running sandbox id of owner.
func (m *Manager) Grade(ctx context.Context, owner, id string, req api.GradeRequest) (api.GradeResult, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.GradeResult{}, err
	}
	if rec.Labels[gradeLabel] != "" {
		return api.GradeResult{}, errdefs.New(errdefs.Conflict, api.CodeGradingSandbox, "sandbox %s is itself a grading", id)
	}
	if err := m.gradeDefaults(&req, rec.Tier); err != nil {
		return api.GradeResult{}, err
	}
	if rec.ImageSource != "" && rec.ImageSource != "layers" {
		return api.GradeResult{}, errdefs.New(errdefs.Unsupported, api.CodeGradingNeedsLayers, "sandbox %s runs a development directory image: sealed grading needs an image of layers", id)
	}
	img, err := m.images.Resolve(ctx, rec.ImageID)
	if err != nil {
		return api.GradeResult{}, err
	}
	var layers []api.ImageLayer
	for _, l := range img.Manifest.Layers {
		layers = append(layers, api.ImageLayer{Role: l.Role, ID: l.ID})
	}
	layers = append(layers, api.ImageLayer{Role: "tests", ID: req.TestsLayer})
	sealedImg, err := m.images.Compose(ctx, layers, nil)
	if err != nil {
		return api.GradeResult{}, err
	}
	testsID := sealedImg.Layers[len(sealedImg.Layers)-1].ID
	if slices.Contains(rec.Layers, testsID) {
		return api.GradeResult{}, errdefs.New(errdefs.Invalid, api.CodeTestsLayerSeen, "sandbox %s has layer %s: the tests must come from a layer it never had", id, req.TestsLayer)
	}
	provided, err := m.images.LayerPaths(ctx, testsID)
	if err != nil {
		return api.GradeResult{}, fmt.Errorf("the tests layer's files: %w", err)
	}
	var declared []grading.TestID
	if dir, ok := provided[grading.DeclaredTestsPath]; ok && !dir {
		b, err := m.images.ReadLayerFile(ctx, testsID, grading.DeclaredTestsPath, grading.MaxDeclaredBytes)
		if err != nil {
			return api.GradeResult{}, fmt.Errorf("the tests layer's declared tests: %w", err)
		}
		if declared, err = grading.ParseDeclared(b); err != nil {
			return api.GradeResult{}, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidDeclaredTests, err, "layer %s declares its tests wrongly", req.TestsLayer)
		}
	}
	start := time.Now()
	res := api.GradeResult{Sandbox: id, At: start.UTC(), Discarded: []string{}}

	// The sealed sandbox: the agent's limits, no network, the trainer's
	// environment (not anything the agent set), two phases: "restore"
	// while the files go in, "grading" for the run.
	reportDir := path.Dir(req.Report)
	// Container tiers: /tmp is a mount of its own, so a report directory
	// below it is writable with it (a phase's paths do not cross mounts).
	writable := []string{reportDir}
	if rec.Tier != api.TierFunction {
		writable = []string{"/tmp"}
		if !grading.Under(reportDir, "/tmp") {
			writable = append(writable, reportDir)
		}
	}
	env := maps.Clone(rec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, req.Env)
	timeout := int(req.TimeoutS) + 120
	grader, err := m.Create(ctx, owner, api.CreateSandboxRequest{
		Tier: rec.Tier, Layers: layers, CPU: rec.CPU, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB,
		TimeoutS: timeout, Env: env, Labels: map[string]string{gradeLabel: id},
		Phases: []api.Phase{{Name: "restore"}, {Name: "grading", Writable: writable}, {Name: "judging", Writable: writable}},
	})
	if err != nil {
		return api.GradeResult{}, fmt.Errorf("the grading sandbox: %w", err)
	}
	res.Grader = grader.ID
	defer func() {
		if err := m.Delete(context.WithoutCancel(ctx), owner, grader.ID, "grading done"); err != nil {
			m.log.Warn("destroying a grading sandbox", "sandbox", grader.ID, "err", err)
		}
	}()
	f := grading.Filter{Sealed: req.Sealed, Protected: append(slices.Clone(grading.DefaultProtected), req.Protected...), ReportDir: reportDir, Provided: provided}
	if err := m.carry(ctx, owner, id, grader.ID, req.Carry, &f, &res); err != nil {
		return api.GradeResult{}, err
	}
	if _, err := m.Mkdir(ctx, owner, grader.ID, reportDir, true); err != nil {
		return api.GradeResult{}, fmt.Errorf("the report directory: %w", err)
	}
	monitored, _ := oversight(m.view.list(), grader.Node, rec.Tier)
	audit := gradeAudit{enabled: monitored && rec.Tier != api.TierFunction}
	if audit.enabled {
		if audit.nonce, err = randomNonce(); err != nil {
			return api.GradeResult{}, err
		}
		// The first mark: the run's events are those after it.
		audit.mark(ctx, m, owner, grader.ID, "/.dsec-grade-start-"+audit.nonce)
		if err := m.RemoveFile(ctx, owner, grader.ID, "/.dsec-grade-start-"+audit.nonce, false); err != nil && errdefs.ClassOf(err) != errdefs.NotFound {
			m.log.Warn("removing a grading mark", "sandbox", grader.ID, "err", err)
		}
	}
	if _, err := m.SetPhase(ctx, owner, grader.ID, api.SetPhaseRequest{Phase: "grading"}); err != nil {
		return api.GradeResult{}, fmt.Errorf("sealing the grading sandbox: %w", err)
	}
	run, err := m.Exec(ctx, owner, grader.ID, api.ExecRequest{Cmd: req.Cmd, Command: req.Command, Cwd: req.Cwd, TimeoutS: req.TimeoutS, MaxOutputBytes: gradeOutput}, nil)
	if err != nil {
		return api.GradeResult{}, fmt.Errorf("running the grader: %w", err)
	}
	res.ExitCode, res.TimedOut = run.ExitCode, run.TimedOut
	res.Output = tail(run.Stdout+run.Stderr, gradeOutput)
	// Nothing the run started outlives it: a process left behind could
	// still rewrite the report while it is read.
	if _, err := m.SetPhase(ctx, owner, grader.ID, api.SetPhaseRequest{Phase: "judging"}); err != nil {
		return api.GradeResult{}, fmt.Errorf("ending the grading run: %w", err)
	}
	ev := grading.Evidence{Expected: req.ExpectedTests, Declared: declared, ExitCode: run.ExitCode, Audited: audit.enabled}
	if !run.TimedOut && run.Error != "" {
		ev.Abnormal = run.Error
	}
	if audit.enabled {
		// The second mark: once it is in the store, so is every event of
		// the run before it (one ring buffer, one publisher, in order).
		audit.mark(ctx, m, owner, grader.ID, path.Join(reportDir, ".dsec-grade-end-"+audit.nonce))
		evs, err := audit.events(ctx, m, grader.ID)
		if err != nil {
			ev.AuditErr = err
		}
		ev.Audit = grading.ReadRunAudit(evs, req.Report, req.Reporter)
	}
	var cases []api.TestCase
	cases, ev.ReportErr = m.readReport(ctx, owner, grader.ID, req.Report)
	grading.Decide(&res, cases, ev)
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000

	sum := api.GradeSummary{At: res.At, TestsLayer: req.TestsLayer, Verdict: res.Verdict, Reason: res.Reason, Tests: res.Tests, Passed: res.Passed, Discarded: len(res.Discarded)}
	if _, err := m.mutate(ctx, id, func(r *store.SandboxRecord) (bool, error) {
		r.Grades = append(r.Grades, sum)
		if len(r.Grades) > maxGrades {
			r.Grades = r.Grades[len(r.Grades)-maxGrades:]
		}
		return true, nil
	}); err != nil {
		return api.GradeResult{}, err
	}
	if res.Integrity, err = m.Integrity(ctx, owner, id); err != nil {
		return api.GradeResult{}, err
	}
	return res, nil
}

// carry copies the files under dirs of sandbox from into sandbox to, as
// f lets through, counting them in res. Directories are made in order
// first; files then copy copyWorkers at a time (each is a round trip to
// both sandboxes' nodes).
func (m *Manager) carry(ctx context.Context, owner, from, to string, dirs []string, f *grading.Filter, res *api.GradeResult) error {
	var files []api.FileInfo
	for _, dir := range dirs {
		entries, err := m.ListFiles(ctx, owner, from, dir, 32)
		if errdefs.ClassOf(err) == errdefs.NotFound {
			continue
		}
		if err != nil {
			return fmt.Errorf("listing %s: %w", dir, err)
		}
		slices.SortFunc(entries, func(a, b api.FileInfo) int { return strings.Compare(a.Path, b.Path) })
		var skip []string // dropped directories: nothing below them goes
		for _, e := range entries {
			if slices.ContainsFunc(skip, func(d string) bool { return grading.Under(e.Path, d) }) {
				continue
			}
			keep, why := f.Keep(e.Path, e.Type)
			if !keep {
				res.Discarded = append(res.Discarded, e.Path+" ("+why+")")
				if e.Type == "dir" {
					skip = append(skip, e.Path)
				}
				continue
			}
			if res.Carried++; res.Carried > maxGradeFiles {
				return errdefs.New(errdefs.TooLarge, api.CodeStateTooLarge, "more than %d files to carry", maxGradeFiles)
			}
			if e.Type == "dir" {
				if _, err := m.Mkdir(ctx, owner, to, e.Path, true); err != nil {
					return fmt.Errorf("carrying %s: %w", e.Path, err)
				}
				continue
			}
			if res.CarriedBytes += e.Size; res.CarriedBytes > maxGradeBytes {
				return errdefs.New(errdefs.TooLarge, api.CodeStateTooLarge, "more than %d bytes to carry", maxGradeBytes)
			}
			files = append(files, e)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(copyWorkers)
	for _, e := range files {
		g.Go(func() error { return m.copyFile(gctx, owner, from, to, e) })
	}
	return g.Wait()
}

func (m *Manager) copyFile(ctx context.Context, owner, from, to string, e api.FileInfo) error {
	r, _, err := m.OpenFile(ctx, owner, from, e.Path)
	if err != nil {
		return fmt.Errorf("carrying %s: %w", e.Path, err)
	}
	defer r.Close()
	if _, err := m.WriteFile(ctx, owner, to, e.Path, r, e.Mode&0o777, true); err != nil {
		return fmt.Errorf("carrying %s: %w", e.Path, err)
	}
	return nil
}

// gradeAudit reads a grading run's audit events: those between two
// marks, files the control plane writes through the files API (the
// sandbox's agent writes them, and the node's monitor sees it) before
// and after the run.
type gradeAudit struct {
	enabled bool
	nonce   string
}

// mark writes the mark file p (a write refused by the phase is seen
// too: only the event counts).
func (a *gradeAudit) mark(ctx context.Context, m *Manager, owner, id, p string) {
	if _, err := m.WriteFile(ctx, owner, id, p, strings.NewReader(""), 0o600, false); err != nil {
		m.log.Debug("writing a grading mark", "sandbox", id, "path", p, "err", err)
	}
}

// isMark reports whether e is about one of the marks.
func (a *gradeAudit) isMark(e api.AuditEvent) bool {
	return strings.Contains(e.Path, a.nonce) || strings.Contains(e.Target, a.nonce)
}

// events returns the audit events of sandbox id between the start mark
// and the end mark, waiting up to auditWait for the end mark to arrive.
func (a *gradeAudit) events(ctx context.Context, m *Manager, id string) ([]api.AuditEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, auditWait)
	defer cancel()
	var out []api.AuditEvent
	started, ended := false, false
	errEnd := errors.New("the end mark")
	err := m.st.FollowAuditEvents(ctx, id, 0, func(e api.AuditEvent) error {
		switch {
		case !a.isMark(e):
			if started {
				out = append(out, e)
			}
		case strings.Contains(e.Path+e.Target, "/.dsec-grade-start-"):
			started = true
		case started && strings.Contains(e.Path+e.Target, "/.dsec-grade-end-"):
			ended = true
			return errEnd
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnd) {
		return out, err
	}
	if !ended {
		return out, fmt.Errorf("its events did not all arrive within %s (the start mark seen: %v)", auditWait, started)
	}
	return out, nil
}

func randomNonce() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// readReport reads and parses the grader's report in sandbox id.
func (m *Manager) readReport(ctx context.Context, owner, id, report string) ([]api.TestCase, error) {
	r, info, err := m.OpenFile(ctx, owner, id, report)
	if errdefs.ClassOf(err) == errdefs.NotFound {
		return nil, fmt.Errorf("the grader wrote no report at %s", report)
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if info.Size > grading.MaxReportBytes {
		return nil, errors.New("the report is too large")
	}
	return grading.ParseJUnit(r)
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
