package function

import (
	"context"
	"io/fs"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// Staged permissions in the function tier (sandbox.Phaser). A phase
// decides which workspace paths are writable, to the modules a call runs
// (their WASI view of /workspace) and to the files API alike; the tier
// has no network and no users, so a phase with either is refused at
// create. A change of phase ends the calls of the earlier one (their
// result says "killed").

var _ sandbox.Phaser = (*Sandbox)(nil)

// phaseState is a sandbox's current phase and the context its calls
// derive from, cancelled when the phase ends.
type phaseState struct {
	mu    sync.Mutex // guards the fields below
	cur   *api.Phase
	calls context.Context
	end   context.CancelFunc
}

func (s *Sandbox) initPhase() {
	s.phase.calls, s.phase.end = context.WithCancel(s.life)
	if len(s.spec.Phases) > 0 {
		p := s.spec.Phases[0]
		s.phase.cur = &p
	}
}

// checkPhases refuses capabilities (a sandbox-level list is checked by
// the control plane with the phases): WebAssembly has none.
func checkPhases(phases []api.Phase) error {
	for _, p := range phases {
		if len(p.Capabilities) > 0 {
			return errdefs.New(errdefs.Unsupported, api.CodeTierHasNoCapabilities, "phase %s: the function tier runs WebAssembly, which has no capabilities", p.Name)
		}
	}
	return nil
}

// current returns the current phase (nil without phases) and its calls'
// context.
func (s *Sandbox) current() (*api.Phase, context.Context) {
	s.phase.mu.Lock()
	defer s.phase.mu.Unlock()
	return s.phase.cur, s.phase.calls
}

// Phase implements sandbox.Phaser.
func (s *Sandbox) Phase() string {
	if p, _ := s.current(); p != nil {
		return p.Name
	}
	return ""
}

// SetPhase implements sandbox.Phaser.
func (s *Sandbox) SetPhase(ctx context.Context, p api.Phase) error {
	if err := checkPhases([]api.Phase{p}); err != nil {
		return err
	}
	if p.Executables != nil {
		var err error
		if p.Executables, err = sandbox.NormalizeExecutables(p.Executables); err != nil {
			return err
		}
	}
	s.phase.mu.Lock()
	if s.phase.cur == nil {
		s.phase.mu.Unlock()
		return errdefs.New(errdefs.Conflict, api.CodeNoPhases, "sandbox %s was created without phases", s.spec.ID)
	}
	s.phase.end()
	s.phase.calls, s.phase.end = context.WithCancel(s.life)
	s.phase.cur = &p
	s.phase.mu.Unlock()
	// The earlier phase's calls see their context end; wait for them.
	deadline := time.Now().Add(10 * time.Second)
	for s.running.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	return s.writeState()
}

// writable reports whether the workspace path rel (slash-separated,
// relative to /workspace) may be written in the current phase.
func (s *Sandbox) writable(rel string) bool {
	p, _ := s.current()
	if p == nil || sandbox.WholeRootWritable(*p) {
		return true
	}
	rel = path.Clean(strings.TrimLeft(rel, "/"))
	for _, w := range p.Writable {
		if w == FileRoot {
			return true
		}
		if wr, ok := strings.CutPrefix(w, FileRoot+"/"); ok && (rel == wr || strings.HasPrefix(rel, wr+"/")) {
			return true
		}
	}
	return false
}

// checkExecutable refuses (and audits) a module the current phase's
// executables do not name: its path, such as /bin/<name>.wasm, is what
// they list.
func (s *Sandbox) checkExecutable(clean string) error {
	p, _ := s.current()
	if p == nil || sandbox.ExecutableAllowed(p.Executables, clean) {
		return nil
	}
	if a := s.rt.opts.Audit; a != nil {
		a.Record(s.spec.ID, p.Name, monitor.Event{Time: time.Now(), Kind: monitor.KindExec, Ret: -1, Path: clean})
	}
	return errdefs.New(errdefs.PermissionDenied, api.CodeExecutableNotAllowed, "phase %s does not allow running %s", p.Name, clean)
}

// readOnly is the files API's error for a path the phase does not let it
// write.
func (s *Sandbox) readOnly(abs string) error {
	return errdefs.New(errdefs.PermissionDenied, sandbox.CodeReadOnlyPath, "%s is read-only in phase %s", abs, s.Phase())
}

// auditor records a sandbox's events (audit.Recorder).
type auditor interface {
	Record(id, phase string, e monitor.Event)
}

// audit records a module's call on the workspace path p (relative to
// it; target: a rename's or link's new name, "" for none) with its
// result. The names are the Linux system calls' so that the audit rules
// (test files, startup hooks…) apply as in the container tier.
func (s *Sandbox) audit(call, p, target string, errno experimentalsys.Errno) {
	a := s.rt.opts.Audit
	if a == nil {
		return
	}
	var ret int64
	switch errno {
	case 0:
	case experimentalsys.EROFS:
		ret = -30
	case experimentalsys.EPERM:
		ret = -1
	case experimentalsys.EACCES:
		ret = -13
	case experimentalsys.ENOENT:
		ret = -2
	default:
		ret = -5 // EIO: some other failure
	}
	e := monitor.Event{Time: time.Now(), Kind: monitor.KindSyscall, Syscall: call, Ret: ret,
		Path: path.Join(FileRoot, strings.TrimLeft(p, "/"))}
	if target != "" {
		e.Target = path.Join(FileRoot, strings.TrimLeft(target, "/"))
	}
	a.Record(s.spec.ID, s.Phase(), e)
}

// recordCall records an event of kind (monitor.KindCallTimeout,
// KindMemoryLimit, KindPhaseKill) about a call of module.
func (s *Sandbox) recordCall(kind, module string) {
	s.recordCallIn(s.Phase(), kind, module)
}

// recordCallIn is recordCall for a call of phase.
func (s *Sandbox) recordCallIn(phase, kind, module string) {
	if a := s.rt.opts.Audit; a != nil {
		a.Record(s.spec.ID, phase, monitor.Event{Time: time.Now(), Kind: kind, Path: module})
	}
}

// phaseFS is the workspace as a call's modules see it: writes outside the
// phase's writable paths fail with EROFS. Every write, delete and rename
// is audited.
type phaseFS struct {
	experimentalsys.FS
	s *Sandbox
}

func (f phaseFS) check(paths ...string) experimentalsys.Errno {
	for _, p := range paths {
		if !f.s.writable(p) {
			return experimentalsys.EROFS
		}
	}
	return 0
}

func (f phaseFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR|experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) == 0 {
		return f.FS.OpenFile(p, flag, perm)
	}
	var file experimentalsys.File
	e := f.write("openat", func() (e experimentalsys.Errno) {
		file, e = f.FS.OpenFile(p, flag, perm)
		return e
	}, p)
	return file, e
}

// write runs op, a change to the workspace at paths, if the phase lets
// all of them be written (EROFS otherwise), and audits it as call on the
// first path (a second is a rename's or link's new name).
func (f phaseFS) write(call string, op func() experimentalsys.Errno, paths ...string) experimentalsys.Errno {
	e := f.check(paths...)
	if e == 0 {
		e = op()
	}
	var target string
	if len(paths) > 1 {
		target = paths[1]
	}
	f.s.audit(call, paths[0], target, e)
	return e
}

func (f phaseFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	return f.write("mkdirat", func() experimentalsys.Errno { return f.FS.Mkdir(p, perm) }, p)
}

func (f phaseFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	return f.write("fchmodat", func() experimentalsys.Errno { return f.FS.Chmod(p, perm) }, p)
}

func (f phaseFS) Rename(from, to string) experimentalsys.Errno {
	return f.write("renameat2", func() experimentalsys.Errno { return f.FS.Rename(from, to) }, from, to)
}

func (f phaseFS) Rmdir(p string) experimentalsys.Errno {
	return f.write("unlinkat", func() experimentalsys.Errno { return f.FS.Rmdir(p) }, p)
}

func (f phaseFS) Unlink(p string) experimentalsys.Errno {
	return f.write("unlinkat", func() experimentalsys.Errno { return f.FS.Unlink(p) }, p)
}

// Link needs both names writable: a second name in a writable path for
// a file of a read-only one would let the file be written through it (on
// the container tier the same link crosses mounts and fails).
func (f phaseFS) Link(oldPath, newPath string) experimentalsys.Errno {
	return f.write("linkat", func() experimentalsys.Errno { return f.FS.Link(oldPath, newPath) }, oldPath, newPath)
}

func (f phaseFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	return f.write("utimensat", func() experimentalsys.Errno { return f.FS.Utimens(p, atim, mtim) }, p)
}
