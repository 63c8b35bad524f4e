package agent

import (
	"errors"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Bounds of the process table.
const (
	maxProcs       = 4096 // processes tracked at once (running or kept)
	maxKeptExited  = 256  // exited background processes kept for Wait
	attachBuffer   = 1 << 20
	maxArgvInfo    = 16 << 10 // argv bytes shown in api.Process
	drainGrace     = 200 * time.Millisecond
	defaultPTYRows = 24
	defaultPTYCols = 80
)

// proc is a command the agent started.
type proc struct {
	pid        int
	argv       []string
	startedAt  time.Time
	background bool
	// pty is the terminal's master side, nil without a PTY.
	pty *os.File

	// exited is closed by the reaper once status and endedAt are set.
	exited  chan struct{}
	status  syscall.WaitStatus
	endedAt time.Time

	// stdin is the write end of the command's stdin pipe or the PTY
	// master (nil if the command's stdin was closed at start); it does not
	// change after spawn. stdinShut is set once it is closed.
	stdin     *os.File
	stdinShut atomic.Bool
	stdinMu   sync.Mutex // serializes writes to stdin

	// Background processes only.
	limit          int
	stdout, stderr *sandbox.Capture
	done           chan struct{} // closed once result is final
	result         api.ExecResult

	subsMu sync.Mutex // guards following fields
	subs   map[*subscriber]struct{}
}

// stdio is the agent's side of a command's standard streams.
type stdio struct {
	stdin  *os.File // nil if the command's stdin is already closed
	stdout *os.File // the PTY master with a PTY
	stderr *os.File // nil with a PTY
}

func (s *stdio) closeOutputs() {
	if s.stdout != nil && s.stdout != s.stdin {
		s.stdout.Close()
	}
	if s.stderr != nil {
		s.stderr.Close()
	}
}

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// info describes the process.
func (p *proc) info() api.Process {
	info := api.Process{Pid: p.pid, Cmd: argvInfo(p.argv), State: api.ProcessRunning, StartedAt: p.startedAt}
	if p.hasExited() {
		code := exitCode(p.status)
		info.State, info.ExitCode = api.ProcessExited, &code
	}
	return info
}

// argvInfo bounds the argv shown in listings.
func argvInfo(argv []string) []string {
	total := 0
	for i, a := range argv {
		total += len(a)
		if total > maxArgvInfo {
			return append(slices.Clone(argv[:i]), "…")
		}
	}
	return argv
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Exited() {
		return ws.ExitStatus()
	}
	return -1
}

// spawn starts a command in its own process group (its own session with
// a PTY), with the agent's default environment under the request's, and
// registers it with the reaper. A background process keeps its stdin
// pipe open even if the request gives no stdin, and collects its output.
func (a *agent) spawn(args *agentproto.ExecArgs, background bool) (*proc, stdio, error) {
	if len(args.Argv) == 0 || args.Argv[0] == "" {
		return nil, stdio{}, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "no command given")
	}
	dir, err := a.cwd(args.Cwd)
	if err != nil {
		return nil, stdio{}, err
	}
	env, err := a.env(args.Env, dir, args.PTY != nil)
	if err != nil {
		return nil, stdio{}, err
	}
	prog, err := lookPath(args.Argv[0], env, dir)
	if err != nil {
		return nil, stdio{}, err
	}
	a.mu.Lock()
	n := len(a.procs)
	a.mu.Unlock()
	if n >= maxProcs {
		return nil, stdio{}, errdefs.New(errdefs.RateLimited, api.CodeTooManyProcesses, "the agent already tracks %d processes", n)
	}

	var (
		io    stdio
		child []*os.File
		attr  = &syscall.SysProcAttr{}
	)
	closeAll := func(fs ...*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	if args.PTY != nil {
		master, tty, err := sys.OpenPTY()
		if err != nil {
			return nil, stdio{}, errdefs.Wrap(errdefs.Unavailable, api.CodePtyUnavailable, err, "no pseudo-terminal available")
		}
		rows, cols := args.PTY.Rows, args.PTY.Cols
		if rows == 0 {
			rows = defaultPTYRows
		}
		if cols == 0 {
			cols = defaultPTYCols
		}
		if err := sys.SetWinsize(master, rows, cols); err != nil {
			closeAll(master, tty)
			return nil, stdio{}, err
		}
		io = stdio{stdin: master, stdout: master}
		child = []*os.File{tty, tty, tty}
		attr.Setsid, attr.Setctty, attr.Ctty = true, true, 0
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, stdio{}, errdefs.Wrap(errdefs.Unavailable, api.CodeNoResources, err, "creating pipes")
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			closeAll(inR, inW)
			return nil, stdio{}, errdefs.Wrap(errdefs.Unavailable, api.CodeNoResources, err, "creating pipes")
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll(inR, inW, outR, outW)
			return nil, stdio{}, errdefs.Wrap(errdefs.Unavailable, api.CodeNoResources, err, "creating pipes")
		}
		io = stdio{stdin: inW, stdout: outR, stderr: errR}
		child = []*os.File{inR, outW, errW}
		attr.Setpgid = true
	}
	if args.User.UID != 0 || args.User.GID != 0 {
		// Supplementary groups are cleared (setgroups of none).
		attr.Credential = &syscall.Credential{Uid: args.User.UID, Gid: args.User.GID}
	}
	if a.cgroup != nil {
		attr.UseCgroupFD, attr.CgroupFD = true, int(a.cgroup.Fd())
	}
	// A command's capabilities are ambient ones, root's too: the sandbox
	// setup made root's exec grant nothing of itself (SECBIT_NOROOT), so
	// every command holds exactly these.
	for _, c := range args.User.Caps {
		attr.AmbientCaps = append(attr.AmbientCaps, uintptr(c))
	}
	fds := make([]uintptr, len(child))
	for i, f := range child {
		fds[i] = f.Fd()
	}
	p := &proc{
		argv:      slices.Clone(args.Argv),
		exited:    make(chan struct{}),
		startedAt: time.Now(),
	}
	err = theReaper.start(p, func() (int, error) {
		fork := func() (int, error) {
			return sys.ForkExec(prog, args.Argv, &syscall.ProcAttr{Dir: dir, Env: env, Files: fds, Sys: attr})
		}
		if a.opt.Fork != nil {
			return a.opt.Fork(fork)
		}
		return fork()
	})
	closeAll(child[0], child[1], child[2])
	if err != nil {
		closeAll(io.stdin, io.stderr)
		if io.stdout != io.stdin {
			closeAll(io.stdout)
		}
		return nil, stdio{}, startError(args.Argv[0], err)
	}
	if args.PTY != nil {
		p.pty = io.stdout
	}
	if !background && args.Stdin == "" && !args.StdinStream && args.PTY == nil {
		io.stdin.Close() // the command reads EOF
		io.stdin = nil
	}
	p.stdin = io.stdin
	if background {
		p.background = true
		p.limit = args.MaxOutputBytes
		p.stdout = sandbox.NewCapture(p.limit, nil, true)
		p.stderr = sandbox.NewCapture(p.limit, nil, true)
		p.done = make(chan struct{})
		p.subs = map[*subscriber]struct{}{}
	}
	a.mu.Lock()
	a.procs[p.pid] = p
	a.mu.Unlock()
	return p, io, nil
}

// startError classifies an error of fork/exec.
func startError(name string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return errdefs.Wrap(errdefs.NotFound, api.CodeCommandNotFound, err, "command %q not found", name)
	case errors.Is(err, syscall.EACCES):
		return errdefs.Wrap(errdefs.PermissionDenied, api.CodeCommandNotExecutable, err, "command %q is not executable", name)
	case errors.Is(err, syscall.ENOEXEC):
		return errdefs.Wrap(errdefs.Invalid, api.CodeExecFormatError, err, "command %q is not a program this sandbox can run", name)
	case errors.Is(err, syscall.E2BIG):
		return errdefs.Wrap(errdefs.TooLarge, api.CodeArgumentsTooLarge, err, "the arguments and environment of %q are too large", name)
	case errors.Is(err, syscall.EPERM):
		return errdefs.Wrap(errdefs.PermissionDenied, api.CodeUserNotPermitted, err, "cannot run %q as the requested user", name)
	}
	return errdefs.Wrap(errdefs.Internal, api.CodeStartFailed, err, "starting %q", name)
}

// env builds a command's environment: the defaults with the request's
// variables over them, and PWD naming dir, the command's working
// directory, as the node names it (every tier sets PWD so: Go's and the
// shells' getwd trust it).
func (a *agent) env(req map[string]string, dir string, tty bool) ([]string, error) {
	env := slices.Clone(a.opt.DefaultEnv)
	set := func(k, v string) {
		for i, kv := range env {
			if name, _, _ := strings.Cut(kv, "="); name == k {
				env[i] = k + "=" + v
				return
			}
		}
		env = append(env, k+"="+v)
	}
	keys := make([]string, 0, len(req))
	for k := range req {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := req[k]
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidEnv, "invalid environment variable %q", k)
		}
		set(k, v)
	}
	set("PWD", a.nodePath(dir))
	if tty && getenv(env, "TERM") == "" {
		env = append(env, "TERM=xterm-256color")
	}
	return env, nil
}

// getenv returns the last value of name in env.
func getenv(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// cwd resolves a command's working directory.
func (a *agent) cwd(dir string) (string, error) {
	if dir == "" {
		return a.workdir, nil
	}
	if strings.IndexByte(dir, 0) >= 0 {
		return "", errdefs.New(errdefs.Invalid, sandbox.CodeInvalidCwd, "the working directory contains a NUL byte")
	}
	if !path.IsAbs(dir) {
		dir = path.Join(a.workdir, dir)
	}
	dir = path.Clean(dir)
	fi, err := os.Stat(dir)
	if err := sandbox.CwdError(dir, fi, err); err != nil {
		return "", err
	}
	return dir, nil
}

// nodePath is dir, a directory of the agent's, as the node names it: its
// path in Options.Root, shown to the node as "/" (the same path where the
// root is the agent's own "/", as in every tier).
func (a *agent) nodePath(dir string) string {
	if a.opt.Root == "/" {
		return dir
	}
	if root := path.Clean(a.opt.Root); sandbox.Within(root, dir) {
		return path.Join("/", sandbox.RelPath(root, dir))
	}
	return dir
}

// lookPath finds a program the way a shell does, in the PATH of the
// command's own environment. Names with a slash are taken as they are
// (relative to dir).
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "the command contains a NUL byte")
	}
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, d := range strings.Split(getenv(env, "PATH"), ":") {
		if d == "" {
			d = "."
		}
		p := path.Join(d, name)
		if !path.IsAbs(p) {
			p = path.Join(dir, p)
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errdefs.New(errdefs.NotFound, api.CodeCommandNotFound, "command %q not found in PATH", name)
}

// forget drops a process from the table.
func (a *agent) forget(p *proc) {
	a.mu.Lock()
	if a.procs[p.pid] == p {
		delete(a.procs, p.pid)
	}
	a.mu.Unlock()
}

// lookup finds a process by pid; background limits it to background ones.
func (a *agent) lookup(pid int, background bool) (*proc, error) {
	a.mu.Lock()
	p := a.procs[pid]
	a.mu.Unlock()
	if p == nil || background && !p.background {
		return nil, errdefs.New(errdefs.NotFound, api.CodeProcessNotFound, "no process %d", pid)
	}
	return p, nil
}

// killAll kills every process group the agent started and waits (a
// bounded time) for them and their background supervisors.
func (a *agent) killAll() {
	a.mu.Lock()
	procs := make([]*proc, 0, len(a.procs))
	for _, p := range a.procs {
		procs = append(procs, p)
	}
	a.mu.Unlock()
	deadline := time.After(5 * time.Second)
	for _, p := range procs {
		if !p.hasExited() {
			theReaper.signalGroup(p, syscall.SIGKILL)
		}
	}
	for _, p := range procs {
		wait := p.exited
		if p.background {
			wait = p.done
		}
		select {
		case <-wait:
		case <-deadline:
			a.logger.Warn("processes outlive the agent", "pid", p.pid)
			return
		}
	}
}

// drain is how a command's output is read once it has exited: on while
// it keeps coming (each read may wait drainGrace), drainCap in all. A
// fixed grace from the exit lost output the command had written before
// it exited, when the reader was slow to get to it (a loaded machine, a
// slow node connection): up to a pipe's buffer of it.
type drain struct {
	on    atomic.Bool
	until time.Time // set before on
}

// drainCap bounds the reading of an exited command's output.
const drainCap = 10 * time.Second

func (d *drain) start() {
	d.until = time.Now().Add(drainCap)
	d.on.Store(true)
}

// readOutput reads f until it ends (EOF, EIO from a PTY whose terminal
// is closed, a read deadline, Close), handing each chunk to emit, which
// returns whether it kept the buffer. Once d has started, each read may
// wait drainGrace (within the cap).
func (d *drain) readOutput(f *os.File, emit func([]byte) bool) {
	buf := make([]byte, agentproto.ChunkSize)
	for {
		if d.on.Load() {
			next := time.Now().Add(drainGrace)
			if next.After(d.until) {
				next = d.until
			}
			f.SetReadDeadline(next)
		}
		n, err := f.Read(buf)
		if n > 0 && emit(buf[:n]) {
			buf = make([]byte, agentproto.ChunkSize)
		}
		if err != nil {
			return
		}
	}
}

// endResult builds the result of a process that has exited.
func endResult(p *proc, timedOut, cancelled bool) api.ExecResult {
	res := api.ExecResult{DurationMS: max(float64(p.endedAt.Sub(p.startedAt).Microseconds())/1000, 0.001)}
	ws := p.status
	switch {
	case timedOut:
		res.ExitCode, res.TimedOut, res.Error = -1, true, "timeout"
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case cancelled:
		res.ExitCode, res.Error = -1, "canceled"
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		res.ExitCode, res.Error = -1, "killed"
	case ws.Signaled():
		res.ExitCode, res.Error = -1, "signal "+signalName(ws.Signal())
	default:
		res.ExitCode, res.Error = -1, "no exit status"
	}
	return res
}
