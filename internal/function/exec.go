package function

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/tetratelabs/wazero/sys"
)

const (
	// defaultTimeout applies to requests without a timeout.
	defaultTimeout = 60 * time.Second
	// imageTrust is how long a module file of an image is used without
	// checking whether it changed. Images are read-only trees; the check
	// only catches an operator replacing one in place.
	imageTrust = time.Second
)

// Exec implements sandbox.Sandbox. argv[0] names a module: a tool name
// runs /bin/<name>.wasm of the image; a path ending in .wasm runs that
// module, from the image or from /workspace. The module sees argv
// unchanged, the spec's environment overlaid by the request's, PWD set to
// the working directory (default /workspace), and the image at / with the
// workspace at /workspace.
//
// A trap ends the call with exit code -1 and Error "wasm trap: …" (a call
// stack reaching the memory limit: "wasm trap: stack overflow: …"); the
// timeout with TimedOut and Error "timeout". If ctx ends first, Exec
// returns an error wrapping ctx.Err(). A missing tool is an error of class
// NotFound (code tool_not_found); a module that needs more memory than the
// sandbox's limit before it runs one of class TooLarge (memory_limit), and
// one past the tier's limits on modules TooLarge (module_too_large,
// module_limit).
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	if err := s.enter(); err != nil {
		return api.ExecResult{}, err
	}
	defer s.ops.leave()
	if !s.rt.calls.enter() {
		return api.ExecResult{}, errClosed()
	}
	defer s.rt.calls.leave()

	argv, err := sandbox.Argv(Tier, s.rt.Capabilities(), &req)
	if err != nil {
		return api.ExecResult{}, err
	}
	cwd, err := s.workingDir(req.Cwd)
	if err != nil {
		return api.ExecResult{}, err
	}
	env, err := s.environ(req.Env, cwd)
	if err != nil {
		return api.ExecResult{}, err
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return api.ExecResult{}, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "an argument contains a NUL byte")
		}
	}
	timeout := defaultTimeout
	if req.TimeoutS > 0 {
		timeout = time.Duration(req.TimeoutS * float64(time.Second))
	}

	m, err := s.module(argv[0], cwd)
	if err != nil {
		return api.ExecResult{}, err
	}
	defer s.rt.mods.done(m)
	if need := m.fixed + m.minMemory; need > s.memoryLimit() {
		// Refused before an instance takes the memory.
		return api.ExecResult{}, s.tooLarge(argv[0], need)
	}
	select {
	case s.rt.slots <- struct{}{}:
		defer func() { <-s.rt.slots }()
	case <-ctx.Done():
		return api.ExecResult{}, fmt.Errorf("waiting to run %s: %w", argv[0], ctx.Err())
	case <-s.life.Done():
		return api.ExecResult{}, sandbox.ErrGone(s.spec.ID)
	}
	// The call belongs to the phase current when it starts running: read
	// before running counts it, so that a SetPhase which sees the call
	// running also ends it.
	phase, phaseCalls := s.current()
	start := time.Now()
	s.running.Add(1)
	defer func() {
		s.running.Add(-1)
		s.busyNanos.Add(int64(time.Since(start)))
	}()

	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	// A change of phase ends the calls of the earlier one.
	defer context.AfterFunc(phaseCalls, cancel)()

	inst, hit, err := m.pool.get(cctx)
	s.rt.metrics.count(hit)
	if err != nil {
		if err := s.stopped(ctx, argv[0]); err != nil {
			return api.ExecResult{}, err
		}
		return api.ExecResult{}, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidModule, err, "instantiating %s", argv[0])
	}
	defer inst.close()

	// Streamed output is the caller's already: it is not kept (as on
	// every tier; see sandbox.ExecRequest).
	keep := req.Stdout == nil && req.Stderr == nil
	stdout := sandbox.NewCapture(req.MaxOutputBytes, req.Stdout, keep)
	stderr := sandbox.NewCapture(req.MaxOutputBytes, req.Stderr, keep)
	stdin, stopStdin := callStdin(&req, cctx.Done())
	defer stopStdin()
	if err := s.bind(inst, m, stdin, stdout, stderr, cctx.Done(), argv[0]); err != nil {
		return api.ExecResult{}, err
	}
	_, err = inst.start.Call(context.WithValue(cctx, callKey{}, newCallArgs(argv, env)))
	memCapped := inst.mem != nil && inst.mem.refused()
	overflow := err != nil && inst.acct.overflowed()
	inst.close() // frees the memory before the result is built

	res := api.ExecResult{DurationMS: max(float64(time.Since(start).Microseconds())/1000, 0.001)}
	res.Stdout, res.StdoutTruncated = stdout.Result()
	res.Stderr, res.StderrTruncated = stderr.Result()
	if err := s.stopped(ctx, argv[0]); err != nil {
		return api.ExecResult{}, err
	}
	var exit *sys.ExitError
	if phase != nil {
		res.Phase = phase.Name
	}
	if memCapped || overflow {
		s.recordCall(monitor.KindMemoryLimit, argv[0])
	}
	switch {
	case s.life.Err() != nil || phaseCalls.Err() != nil:
		res.ExitCode, res.Error = -1, "killed"
		if s.life.Err() == nil && phase != nil {
			// Ended by a phase change: on the record, in its own phase.
			s.recordCallIn(phase.Name, monitor.KindPhaseKill, argv[0])
		}
	case cctx.Err() != nil:
		res.ExitCode, res.TimedOut, res.Error = -1, true, "timeout"
		s.recordCall(monitor.KindCallTimeout, argv[0])
	case err == nil:
	case errors.As(err, &exit):
		res.ExitCode = int(exit.ExitCode())
	case overflow:
		res.ExitCode = -1
		res.Error = fmt.Sprintf("wasm trap: stack overflow: the call stack reached the sandbox's memory limit (%d MiB with the memory and tables in use)", s.memoryLimit()>>20)
	default:
		res.ExitCode, res.Error = -1, "wasm trap: "+trapMessage(err)
	}
	return res, nil
}

// bind points a checked-out instance at this call: its streams, the
// sandbox's file systems, the call's end, and the memory limit, which
// bounds the instance's linear memory, the memory its tables and other
// declarations hold, and the room its stack and table growth are charged
// to, together.
func (s *Sandbox) bind(inst *instance, m *module, stdin io.Reader, stdout, stderr io.Writer, done <-chan struct{}, name string) error {
	inst.stdin.r = stdin
	inst.stdout.w = stdout
	inst.stderr.w = stderr
	inst.root.FS = s.img.fs
	inst.work.FS = s.workFS
	inst.sleep.done = done
	limit := s.memoryLimit()
	need := m.fixed + inst.acct.taken()
	if inst.mem != nil {
		if !inst.mem.checkout(limit, &s.memBytes, &inst.acct) {
			return s.tooLarge(name, need+inst.mem.size())
		}
		need += inst.mem.size()
	}
	if need > limit {
		return s.tooLarge(name, need)
	}
	inst.acct.start(limit-need, m.start)
	return nil
}

// memoryLimit is what a call may take of the host's memory: its linear
// memory, the memory its instance holds for tables and other declarations,
// and its stack.
func (s *Sandbox) memoryLimit() uint64 {
	if s.spec.MemoryMB <= 0 {
		return maxMemoryPages * pageSize
	}
	return uint64(s.spec.MemoryMB) << 20
}

// tooLarge is the error for a module that needs more than the sandbox's
// memory limit before it runs.
func (s *Sandbox) tooLarge(name string, need uint64) error {
	return errdefs.New(errdefs.TooLarge, api.CodeMemoryLimit,
		"%s needs %d MiB of memory to start; the sandbox allows %d MiB", name, (need+1<<20-1)>>20, s.memoryLimit()>>20)
}

// stopped returns the error for a call whose caller went away (ctx ended).
func (s *Sandbox) stopped(ctx context.Context, name string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("running %s: %w", name, ctx.Err())
	}
	return nil
}

// trapMessage is the first line of a wazero runtime error, without its
// "wasm error: " prefix.
func trapMessage(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return strings.TrimPrefix(msg, "wasm error: ")
}

// workingDir resolves a request's working directory: default
// sandbox.Workdir, relative paths taken relative to it, absolute ones
// anywhere in the guest's tree. A directory the request names must exist
// (sandbox.CwdError), as on every tier; the default always does.
func (s *Sandbox) workingDir(cwd string) (string, error) {
	if cwd == "" {
		return sandbox.Workdir, nil
	}
	dir, err := sandbox.CleanPath("/", cwd)
	if err != nil {
		return "", errdefs.Wrap(errdefs.Invalid, sandbox.CodeInvalidCwd, err, "working directory %q is not valid", cwd)
	}
	root, rel := s.img.root, strings.TrimPrefix(dir, "/")
	if sandbox.Within(FileRoot, dir) {
		root, rel = s.work, sandbox.RelPath(FileRoot, dir)
	}
	if rel == "" {
		rel = "."
	}
	fi, err := root.Stat(rel)
	if err := sandbox.CwdError(dir, fi, err); err != nil {
		return "", err
	}
	return dir, nil
}

// environ is the call's environment: the spec's, overlaid by the
// request's, with PWD set to the working directory (Go's wasip1 runtime
// takes its working directory from PWD). It is sorted.
func (s *Sandbox) environ(reqEnv map[string]string, cwd string) ([]string, error) {
	merged := make(map[string]string, len(s.spec.Env)+len(reqEnv)+1)
	for _, m := range []map[string]string{s.spec.Env, reqEnv} {
		for k, v := range m {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
				return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidEnv, "environment variable %q is not valid", k)
			}
			merged[k] = v
		}
	}
	merged["PWD"] = cwd
	env := make([]string, 0, len(merged))
	for k, v := range merged {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return env, nil
}

// module resolves argv[0] to a compiled module.
func (s *Sandbox) module(name, cwd string) (*module, error) {
	p := name
	switch {
	case !strings.Contains(name, "/") && !strings.HasSuffix(name, ".wasm"):
		p = "/bin/" + name + ".wasm"
	case !path.IsAbs(name):
		p = path.Join(cwd, name)
	}
	clean, err := sandbox.CleanPath("/", p)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(clean, ".wasm") {
		return nil, errdefs.New(errdefs.NotFound, api.CodeToolNotFound,
			"%q is not a tool of image %s: give a tool name (bin/<name>.wasm) or the path of a .wasm module", name, s.imageName())
	}
	if err := s.checkExecutable(clean); err != nil {
		return nil, err
	}
	root, rel, key, trust := s.img.root, strings.TrimPrefix(clean, "/"), s.img.path+clean, imageTrust
	if sandbox.Within(FileRoot, clean) {
		rel = sandbox.RelPath(FileRoot, clean)
		root, key, trust = s.work, s.workDir+"/"+rel, 0
	}
	m, err := s.rt.mods.load(root, rel, key, clean, trust)
	var (
		de *errdefs.Error
		pe *fs.PathError
	)
	switch {
	case err == nil:
		return m, nil
	case errors.As(err, &de):
		return nil, err
	case isNotExist(err):
		return nil, errdefs.Wrap(errdefs.NotFound, api.CodeToolNotFound, err, "tool %q not found in image %s (looked for %s)", name, s.imageName(), clean)
	case errors.As(err, &pe):
		// For instance a symlink leaving the tree, which os.Root refuses.
		return nil, errdefs.Wrap(errdefs.NotFound, api.CodeToolNotFound, err, "tool %q cannot be opened in image %s (%s)", name, s.imageName(), clean)
	}
	return nil, err
}

func (s *Sandbox) imageName() string {
	switch {
	case s.spec.Image.Name != "":
		return s.spec.Image.Name
	case s.spec.Image.ID != "":
		return s.spec.Image.ID
	}
	return s.spec.Image.Root
}
