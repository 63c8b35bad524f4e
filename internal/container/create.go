package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// maxSockPath is the size of sockaddr_un's sun_path.
const maxSockPath = 108

// Create implements sandbox.Runtime: a warm sandbox claimed for spec if
// the pool has one (warm.go), else one built now. Everything it builds
// is undone if a later step fails.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if !idPattern.MatchString(spec.ID) {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidSandboxID, "sandbox ID %q is not valid", spec.ID)
	}
	if len(spec.Image.Layers) == 0 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeImageNeedsLayers, "the container tier runs layered images, and %s has no layers", spec.Image.Name)
	}
	// The agent's socket path must fit in a unix socket address (108
	// bytes with its NUL); a longer one failed deep in the sandbox's
	// setup, with "bind: invalid argument".
	if sock := filepath.Join(r.sandboxDir(spec.ID), "sock", setup.SockName); len(sock) >= maxSockPath {
		return nil, errdefs.New(errdefs.Invalid, api.CodeSandboxIDTooLong,
			"sandbox ID %q is too long for this node's state directory: its agent's socket path would be %d bytes long, at most %d fit", spec.ID, len(sock), maxSockPath-1)
	}
	if err := r.checkNew(spec.ID); err != nil {
		return nil, err
	}
	if err := checkSpec(&spec); err != nil {
		return nil, err
	}
	if err := r.checkEnforceable(spec); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opt.ReadyTimeout)
	defer cancel()
	sb := r.claimWarm(ctx, spec)
	if sb == nil {
		var err error
		if sb, err = r.build(ctx, spec, false); err != nil {
			return nil, err
		}
	}
	err := r.startPhase(ctx, sb)
	if err == nil {
		// Running means an agent that answers: one that went away since
		// its greeting is not handed out.
		err = sb.alive()
	}
	if err == nil {
		r.watch(sb)
		err = sb.openExitWatch()
	}
	r.mu.Lock()
	if err == nil {
		err = r.checkNewLocked(spec.ID)
	}
	if err == nil {
		r.sandboxes[spec.ID] = sb
	}
	r.mu.Unlock()
	if err != nil {
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil, err
	}
	sb.watchAgent()
	return sb, nil
}

// CodeStartTimeout is the code of a create whose sandbox was not ready
// by the start deadline (Options.ReadyTimeout): on a node starting too
// much at once, not a fault of the sandbox's.
const CodeStartTimeout = api.CodeSandboxStartTimeout

// startError is the error of a sandbox whose start failed with err
// (everything it made is undone): retryable if its deadline ran out,
// else internal.
func startError(ctx context.Context, id string, err error) error {
	if ctx.Err() != nil {
		return &errdefs.Error{Class: errdefs.Unavailable, Code: CodeStartTimeout,
			Msg:   fmt.Sprintf("sandbox %s was not ready in time: the node is busy; nothing was kept, retry later", id),
			Cause: err, RetryAfter: time.Second}
	}
	return errdefs.Wrap(errdefs.Internal, api.CodeSandboxStartFailed, err, "sandbox %s did not start", id)
}

// startPhase applies the first of sb's phases, if it has any (nothing
// of the sandbox's has run yet).
func (r *Runtime) startPhase(ctx context.Context, sb *Sandbox) error {
	phases := sb.state.Spec.Phases
	if len(phases) == 0 {
		return nil
	}
	p := phases[0]
	if err := r.applyPhase(ctx, sb, p, nil); err != nil {
		return err
	}
	st := *sb.state
	st.Phase = &p
	if err := st.write(sb.dir); err != nil {
		return err
	}
	sb.state = &st
	return nil
}

// watch has the node's monitor watch sb (from before any command of its
// runs). A sandbox the monitor cannot watch still runs: the monitor
// observes, the host-side rules enforce.
func (r *Runtime) watch(sb *Sandbox) {
	if r.opt.Monitor == nil || sb.cg.ID() == 0 {
		return
	}
	if err := r.opt.Monitor.Watch(sb.id, sb.cg.ID(), sb.phaseAt); err != nil {
		r.log.Warn("the monitor cannot watch a sandbox", "sandbox", sb.id, "err", err)
	}
}

// checkNew fails if the runtime is closed or has a sandbox id.
func (r *Runtime) checkNew(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checkNewLocked(id)
}

func (r *Runtime) checkNewLocked(id string) error {
	if r.closed {
		return errClosed()
	}
	if _, dup := r.sandboxes[id]; dup {
		return errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s exists", id)
	}
	return nil
}

// diskMB is the size of spec's writable layer.
func diskMB(spec sandbox.Spec) int {
	if spec.DiskMB <= 0 {
		return 256
	}
	return spec.DiskMB
}

// build makes and starts the sandbox spec (a warm one if warm), without
// registering it.
func (r *Runtime) build(ctx context.Context, spec sandbox.Spec, warm bool) (_ *Sandbox, err error) {
	var cu cleanup.Stack
	defer cu.Clean()
	dir, st, guestExe, releaseGuest, err := r.prepare(ctx, spec, warm, &cu)
	if err != nil {
		return nil, err
	}
	defer releaseGuest()
	root, err := r.newRoot(ctx, dir, spec, &cu)
	if err != nil {
		return nil, err
	}
	defer root.fd.Close()
	st.Rootfs = root.path

	limits := r.limits(spec)
	if warm {
		// A warm sandbox starts at the least CPU weight: its start must
		// not delay the creates, commands and destroys of sandboxes in
		// use (on 2 cores it did, by milliseconds). A claim restores it.
		limits.CPUWeight = 2
	}
	cg, err := r.newCgroups(ctx, spec.ID, limits, &cu)
	if err != nil {
		return nil, err
	}
	st.CgroupBase = cg.Base()

	policy, linked, err := network.Initial(spec.Network, spec.Phases)
	if err != nil {
		return nil, err
	}
	// A sandbox that may reach nothing gets a namespace of its own with
	// only its loopback interface, made by its clone: no veth, address,
	// route or firewall element (the default policy, and the cheapest).
	ep := &network.Endpoint{}
	if linked {
		if ep, err = r.opt.Network.Acquire(ctx, spec.ID, policy); err != nil {
			return nil, err
		}
		cu.Add(func() {
			if err := r.opt.Network.Release(context.Background(), spec.ID); err != nil {
				r.log.Warn("releasing network of a failed create", "sandbox", spec.ID, "err", err)
			}
		})
		st.Netns = ep.NetnsPath
	}
	cfg, err := r.firstConfig(dir, spec, ep)
	if err != nil {
		return nil, err
	}
	cfg.Rootfs, cfg.RootFD = root.path, 6
	if st.Owner, err = r.takeOwner(&cu); err != nil {
		return nil, err
	}
	run, err := r.startFirst(ctx, guestExe, dir, ep.NetnsPath, cg, cfg, root.fd, st.Owner, &cu)
	if err != nil {
		return nil, startError(ctx, spec.ID, err)
	}
	st.Pid = run.pid
	if err := st.write(dir); err != nil {
		run.client.Close()
		return nil, err
	}
	cu.Release()
	return &Sandbox{rt: r, id: spec.ID, dir: dir, state: st, agent: agentsandbox.NewAgent(Tier, spec.ID, run.client), cg: cg, wait: run.wait, releaseRoot: root.release, upper: root.upper, upperDir: root.upperDir}, nil
}

// prepare makes sandbox spec's directory (removed by cu) and state, and
// finds its agent binary: from the image's toolkit layer mount,
// read-only (release lets the mount go).
func (r *Runtime) prepare(ctx context.Context, spec sandbox.Spec, warm bool, cu *cleanup.Stack) (dir string, st *state, exe string, release func(), err error) {
	if dir, err = r.newDir(spec.ID, cu); err != nil {
		return "", nil, "", nil, err
	}
	if exe, release, err = r.findGuest(ctx, spec.Image.Layers); err != nil {
		return "", nil, "", nil, err
	}
	return dir, &state{Spec: spec, Created: time.Now().UTC(), Warm: warm}, exe, release, nil
}

// newDir makes the directory of sandbox id, removed by cu.
func (r *Runtime) newDir(id string, cu *cleanup.Stack) (string, error) {
	dir := r.sandboxDir(id)
	// Searchable, not listable, by the sandbox's root (see reachable).
	if err := os.Mkdir(dir, 0o711); err != nil {
		return "", fmt.Errorf("creating sandbox directory: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		_ = os.Remove(dir)
		return "", err
	}
	cu.Add(func() { _ = os.RemoveAll(dir) })
	return dir, nil
}

// newRoot is a sandbox's root as build and bindIdle make it: a detached
// overlay of its layers over a writable upper, and where it is attached.
type newRoot struct {
	fd       *os.File // the detached root, for the sandbox (the caller closes it)
	path     string   // the empty directory it is attached on
	release  func()   // drops the layers' references
	upper    *os.Root // the upper, for step marks and snapshots
	upperDir *os.File
}

// newRoot makes spec's root in the sandbox directory dir; cu undoes it.
func (r *Runtime) newRoot(ctx context.Context, dir string, spec sandbox.Spec, cu *cleanup.Stack) (newRoot, error) {
	// Writable upper: a tmpfs of the sandbox's disk size (its pages are
	// charged to the sandbox's memory cgroup, the process that writes them).
	upper := filepath.Join(dir, "upper")
	if err := os.Mkdir(upper, 0o700); err != nil {
		return newRoot{}, err
	}
	disk := diskMB(spec)
	// nr_inodes caps files as size caps bytes (one inode per 4 KiB of
	// disk, at least 16 Ki): without it a sandbox could pin kernel memory
	// with empty files.
	inodes := max(disk*256, 16384)
	if err := sys.MountTmpfs("dsec-upper", upper, fmt.Sprintf("size=%dm,nr_inodes=%d,mode=0755,uid=%d,gid=%d", disk, inodes, r.opt.HostUID, r.opt.HostGID)); err != nil {
		return newRoot{}, err
	}
	cu.Add(func() { _ = sys.Unmount(upper) })

	// The root never enters the host's mount table (see DetachedRoot):
	// the sandbox attaches it in its own, on an empty directory.
	rootFD, releaseRoot, err := r.opt.Layers.DetachedRoot(ctx, spec.ID, spec.Image.Layers, upper)
	if err != nil {
		return newRoot{}, err
	}
	cu.Add(releaseRoot)
	cu.Add(func() { rootFD.Close() })
	// A handle on the upper, for step marks and snapshots (steps.go):
	// the only way to it once it is detached. It holds the tmpfs too,
	// until Destroy closes it.
	upperDir, upperRoot, err := openUpper(filepath.Join(upper, "upper"))
	if err != nil {
		return newRoot{}, err
	}
	cu.Add(func() { upperRoot.Close(); upperDir.Close() })
	// The overlay holds its upper: the tmpfs leaves the table too, and
	// goes with the last mount of the root.
	if err := sys.DetachMount(upper); err != nil {
		return newRoot{}, err
	}
	rootfs := filepath.Join(dir, "root")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return newRoot{}, err
	}
	return newRoot{fd: rootFD, path: rootfs, release: releaseRoot, upper: upperRoot, upperDir: upperDir}, nil
}

// newCgroups makes sandbox id's cgroups; cu removes them.
func (r *Runtime) newCgroups(ctx context.Context, id string, limits cgroups.Limits, cu *cleanup.Stack) (*cgroups.Group, error) {
	cg, err := r.opt.Cgroups.Create(ctx, id, limits)
	if err != nil {
		return nil, err
	}
	cu.Add(func() {
		if err := cg.Destroy(context.Background()); err != nil {
			r.log.Warn("removing cgroups of a failed create", "sandbox", id, "err", err)
		}
	})
	return cg, nil
}

// firstConfig is the config of the first process of sandbox spec, in
// dir, on endpoint ep, without its root; it makes its socket directory.
func (r *Runtime) firstConfig(dir string, spec sandbox.Spec, ep *network.Endpoint) (setup.SandboxConfig, error) {
	sockDir := filepath.Join(dir, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		return setup.SandboxConfig{}, err
	}
	// The agent (sandbox root) creates its socket here.
	if err := os.Chown(sockDir, r.opt.HostUID, r.opt.HostGID); err != nil {
		return setup.SandboxConfig{}, err
	}
	caps := sandbox.MaxCapabilities(spec)
	prog, err := r.seccomp(caps)
	if err != nil {
		return setup.SandboxConfig{}, err
	}
	cfg := identity(spec.ID, ep)
	cfg.KeepCaps, cfg.SockDir, cfg.Seccomp = capNumbers(caps), sockDir, prog
	if ep.NetnsPath == "" {
		// Every group of the sandbox may ping: its own ids.
		cfg.OwnNetwork, cfg.NetSysctls = true, network.LoopbackSysctls(fmt.Sprintf("0 %d", r.opt.IDCount-1))
	}
	return cfg, nil
}

// identity is the part of a first process's config that names sandbox
// id on endpoint ep: hostname, /etc files, environment.
func identity(id string, ep *network.Endpoint) setup.SandboxConfig {
	return setup.SandboxConfig{Hostname: agentsandbox.Hostname(id), Hosts: agentsandbox.HostsFile(id, ep),
		ResolvConf: agentsandbox.ResolvConf(ep), Env: agentsandbox.BaseEnv(nil)}
}

// takeOwner takes the owner of a sandbox's user namespace: per-user
// kernel counts are charged to it (owners.go); cu gives it back.
func (r *Runtime) takeOwner(cu *cleanup.Stack) (int, error) {
	owner, err := r.owners.take()
	if err != nil {
		return 0, err
	}
	cu.Add(func() { r.owners.release(owner) })
	return owner, nil
}

// startFirst is start, with the process killed by cu.
func (r *Runtime) startFirst(ctx context.Context, exe, dir, netns string, cg *cgroups.Group, cfg setup.SandboxConfig, root *os.File, owner int, cu *cleanup.Stack) (started, error) {
	run, err := r.start(ctx, exe, dir, netns, cg, cfg, root, owner)
	if run.pid != 0 {
		cu.Add(func() {
			_ = cg.Kill(context.Background())
			run.wait()
		})
	}
	return run, err
}

func (r *Runtime) limits(spec sandbox.Spec) cgroups.Limits {
	mem := int64(spec.MemoryMB) << 20
	if mem <= 0 {
		mem = 256 << 20
	}
	return cgroups.Limits{CPU: spec.CPU, MemoryBytes: mem, Pids: r.opt.Pids, AgentMemoryBytes: agentMemoryBytes}
}

// seccomp returns the filter of sandboxes whose commands may hold caps
// (some calls are allowed only with a capability: chroot with
// CAP_SYS_CHROOT), compiled once per set.
func (r *Runtime) seccomp(caps []string) ([]byte, error) {
	if r.opt.Seccomp == nil {
		return nil, nil
	}
	key := strings.Join(caps, ",")
	r.smu.Lock()
	defer r.smu.Unlock()
	if prog, ok := r.seccomps[key]; ok {
		return prog, nil
	}
	prog, err := r.opt.Seccomp(caps)
	if err != nil {
		return nil, err
	}
	if r.seccomps == nil {
		r.seccomps = map[string][]byte{}
	}
	r.seccomps[key] = prog
	return prog, nil
}

// capNumbers are the numbers of capabilities (canonical names).
func capNumbers(names []string) []int {
	var out []int
	for _, n := range names {
		if c, ok := sandbox.CapabilityNumber(n); ok {
			out = append(out, c)
		}
	}
	return out
}

// checkSpec checks spec's capabilities and executables (the control
// plane did, for what comes through the API) and makes them canonical,
// without changing the caller's phases.
func checkSpec(spec *sandbox.Spec) error {
	req := api.CreateSandboxRequest{Tier: Tier, Capabilities: spec.Capabilities, Phases: slices.Clone(spec.Phases)}
	if err := sandbox.CheckCapsAndExecutables(&req); err != nil {
		return err
	}
	spec.Capabilities, spec.Phases = req.Capabilities, req.Phases
	return nil
}

// findGuest returns the agent binary's path in the topmost layer that has
// it: a file on a read-only erofs mount, which nothing in a sandbox can
// write (the CVE-2019-5736 class of attack has no file to overwrite).
// A state layer (a snapshot) is skipped: it holds what a sandbox wrote,
// and a sandbox that wrote its own program there must not have it run as
// its children's first process, which sets them up with every capability
// of their namespaces and before their seccomp filter.
func (r *Runtime) findGuest(ctx context.Context, layers []layerspec.Layer) (string, func(), error) {
	p, _, release, err := r.findGuestLayer(ctx, layers)
	return p, release, err
}

// findGuestLayer is findGuest, also returning the index of the layer.
func (r *Runtime) findGuestLayer(ctx context.Context, layers []layerspec.Layer) (string, int, func(), error) {
	for i := len(layers) - 1; i >= 0; i-- {
		if layers[i].Manifest.Source.Kind == layerspec.SourceState {
			continue
		}
		dir, release, err := r.opt.Layers.View(ctx, layers[i:i+1])
		if err != nil {
			return "", 0, nil, err
		}
		p := filepath.Join(dir, GuestPath)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, i, release, nil
		}
		release()
	}
	return "", 0, nil, errdefs.New(errdefs.Invalid, api.CodeImageLacksGuest,
		"the container tier needs the agent at /%s: add the toolkit/dsec-guest layer to the image", GuestPath)
}

// errZygoteLost: the zygote's answer to a request did not come (it
// died, or the answer was late). It may have forked a process for the
// request, which holds the request's descriptors: they must not go to
// another process, or two would read one config and share one
// connection, and the one the node never heard of would run outside
// every cgroup (what an overloaded node once left behind).
var errZygoteLost = errors.New("the zygote's answer was lost")

// start forks the sandbox's first process in its namespaces, its user
// namespace owned by owner, places it in its cgroups, hands it its
// config and greets its agent over a socket pair made for it, which is
// the node's first connection: the greeting is answered once the sandbox
// is set up, so readiness, connecting and the protocol check are one
// round trip. It returns the process's pid (0 if none was started), a
// function that waits for it to exit and the agent's client. On error
// the process, if one was started, has been killed through its pidfd,
// wherever it failed: before or after it joined its cgroups. A zygote
// whose answer was lost is replaced and asked once more, with new
// descriptors (a process it forked for the first request finds its
// config pipe closed and exits).
//
// With cfg.Deferred (a warm agent without its root; root is nil) it
// returns once the process waits for its root (setup.Waiting), with the
// node's end of the first connection and the sync pipe instead of a
// client (see bindIdle).
func (r *Runtime) start(ctx context.Context, exe, dir, netns string, cg *cgroups.Group, cfg setup.SandboxConfig, root *os.File, owner int) (started, error) {
	for attempt := 1; ; attempt++ {
		st, err := r.startOnce(ctx, exe, dir, netns, cg, cfg, root, owner)
		if !errors.Is(err, errZygoteLost) || attempt == 2 || ctx.Err() != nil {
			return st, err
		}
	}
}

// started is a sandbox's first process as start leaves it: pid is 0 if
// none was started, wait waits for it to exit; client is its agent's, or
// for a deferred start conn and syncR (see start).
type started struct {
	pid    int
	wait   func()
	client *agentproto.Client
	conn   net.Conn
	syncR  *os.File
}

// killWait is how long a failed start waits for the process it killed.
const killWait = 10 * time.Second

func (r *Runtime) startOnce(ctx context.Context, exe, dir, netns string, cg *cgroups.Group, cfg setup.SandboxConfig, root *os.File, owner int) (started, error) {
	var files startFiles
	defer files.close()
	if err := files.open(dir); err != nil {
		return started{}, err
	}
	// The agent binary, executed through a descriptor: the forker's
	// mount namespace does not hold the layer it is on.
	bin, err := os.Open(exe)
	if err != nil {
		return started{}, err
	}
	defer bin.Close()
	if root == nil {
		// A deferred start's fd 6, which its setup closes.
		if root, err = os.Open(os.DevNull); err != nil {
			return started{}, err
		}
		defer root.Close()
	}
	// Without a netns of the node's, the process makes its own (the
	// forking thread then stays in the node's).
	nsPath := netns
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	ns, err := sys.OpenNetns(nsPath)
	if err != nil {
		return started{}, err
	}
	defer ns.Close()
	pid, child, wait, err := r.fork(ctx, ns, netns == "", files.console, []*os.File{files.cfgR, files.syncW, files.guestConn, root, bin}, owner)
	if err != nil {
		return started{}, fmt.Errorf("starting the sandbox: %w", err)
	}
	defer child.Close()
	files.started()
	fail := func(err error) (started, error) {
		// (No pidfd: an old zygote's process that was gone already.)
		if kerr := child.Kill(); kerr != nil {
			r.log.Warn("killing the first process of a failed create", "pid", pid, "err", kerr)
		}
		if werr := child.Wait(killWait); werr != nil {
			r.log.Warn("the first process of a failed create outlived its kill", "pid", pid, "err", werr)
		}
		return started{pid: pid, wait: wait}, err
	}
	if r.testBeforeJoin != nil {
		if err := r.testBeforeJoin(pid); err != nil {
			return fail(err)
		}
	}
	// Under cgroup v1 the parent moves the child while it waits for its
	// config (CLONE_INTO_CGROUP is v2 only): nothing of the sandbox runs
	// outside its cgroups.
	if err := cg.AddProc(pid); err != nil {
		return fail(err)
	}
	conn, err := net.FileConn(files.hostConn)
	if err != nil {
		return fail(err)
	}
	b, err := cfg.Encode()
	if err == nil {
		_, err = files.cfgW.Write(b)
	}
	if err != nil {
		conn.Close()
		return fail(fmt.Errorf("handing the sandbox its config: %w", err))
	}
	files.cfgW.Close()
	if cfg.Deferred {
		if err := awaitWaiting(ctx, conn); err != nil {
			conn.Close()
			return fail(fmt.Errorf("%w (console: %s)", setupError(files.syncR, err), consoleTail(dir)))
		}
		if err := r.placeCommands(pid, cg); err != nil {
			conn.Close()
			return fail(err)
		}
		st := started{pid: pid, wait: wait, conn: conn, syncR: files.syncR}
		files.syncR = nil // the caller's now
		return st, nil
	}
	client := agentproto.NewClient(conn, r.log)
	if _, err := client.Hello(ctx); err != nil {
		client.Close()
		return fail(fmt.Errorf("%w (console: %s)", setupError(files.syncR, err), consoleTail(dir)))
	}
	if err := r.placeCommands(pid, cg); err != nil {
		client.Close()
		return fail(err)
	}
	return started{pid: pid, wait: wait, client: client}, nil
}

// awaitWaiting reads a deferred setup's setup.Waiting from conn, within
// ctx.
func awaitWaiting(ctx context.Context, conn net.Conn) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
		defer conn.SetReadDeadline(time.Time{})
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return fmt.Errorf("the agent did not wait for its root: %w", err)
	}
	if b[0] != setup.Waiting {
		return fmt.Errorf("the agent sent %q, not that it waits for its root", b[0])
	}
	return nil
}

// fork starts a sandbox's first process (setup.SandboxCommand) with
// extra as its fds 3–7, joined to network namespace ns (one the node
// owns: sandbox root has no CAP_NET_ADMIN over it) or, with newNet, in
// a new one of its own, its user namespace owned by owner, from the
// forker's small mount namespace: by the zygote, or if it cannot run,
// from a forker thread of the node. It returns the pid, a pidfd of the
// process (for the caller to close) and a function that waits for the
// process to exit. An error wrapping errZygoteLost says the zygote,
// dropped now, may have forked a process that holds extra.
func (r *Runtime) fork(ctx context.Context, ns *os.File, newNet bool, console *os.File, extra []*os.File, owner int) (int, *sys.Pidfd, func(), error) {
	req := setup.ZygoteRequest{UID: r.opt.HostUID, GID: r.opt.HostGID, Count: r.opt.IDCount, NewNet: newNet,
		Owner: owner, Nofile: r.opt.Nofile, Node: r.node}
	files := append([]*os.File{ns, console}, extra...)
	if z := r.zygoteFor(extra[4]); z != nil {
		pid, child, gotOwner, err := z.start(ctx, req, files)
		if err == nil && r.testZygoteAnswer != nil {
			if err = r.testZygoteAnswer(pid); err != nil {
				child.Close()
			}
		}
		switch {
		case errors.Is(err, errRefused):
			return 0, nil, nil, err
		case err != nil:
			// Dead, or out of step (a timed-out answer).
			r.log.Warn("dropping the zygote", "err", err)
			r.dropZygote(z)
			return 0, nil, nil, fmt.Errorf("%w: %w", errZygoteLost, err)
		}
		if child == nil {
			// A zygote too old to send one (the pid is fresh: the zygote
			// answered as it forked, and the process waits for its config).
			child, _ = sys.OpenPidfd(pid)
		}
		if gotOwner == owner {
			// Its parent is the zygote, which lets the kernel reap it.
			return pid, child, func() { waitGone(pid) }, nil
		}
		// A zygote too old to give the namespace its owner: the process
		// goes, and the node forks every sandbox itself from now on.
		r.log.Warn("the zygote cannot give sandboxes' user namespaces their owners: the node forks sandboxes itself")
		_ = child.Kill()
		_ = child.Wait(killWait)
		child.Close()
		r.zmu.Lock()
		r.zygoteFailed = true
		r.zmu.Unlock()
		r.dropZygote(z)
	}
	cmd := setup.SandboxCommand(req, console, extra)
	if err := r.forker.fork(ns, owner, func() error { return setup.StartSandbox(cmd, req) }); err != nil {
		if cmd.Process != nil {
			// Started, and its thread could not go back: it goes.
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		setup.CommandPidfd(cmd).Close()
		return 0, nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return cmd.Process.Pid, setup.CommandPidfd(cmd), func() { <-done }, nil
}

// startFiles are the descriptors start hands the sandbox: its config
// pipe, its sync pipe (where a failed setup writes its error) and one end
// of the node's first connection, plus its console log.
type startFiles struct {
	cfgR, cfgW, syncR, syncW *os.File
	hostConn, guestConn      *os.File
	console                  *os.File
}

func (f *startFiles) open(dir string) error {
	var err error
	if f.cfgR, f.cfgW, err = os.Pipe(); err != nil {
		return err
	}
	if f.syncR, f.syncW, err = os.Pipe(); err != nil {
		return err
	}
	fds, err := sys.Socketpair(syscall.SOCK_STREAM)
	if err != nil {
		return fmt.Errorf("making the agent's connection: %w", err)
	}
	f.hostConn, f.guestConn = os.NewFile(uintptr(fds[0]), "agent-conn"), os.NewFile(uintptr(fds[1]), "agent-conn")
	f.console, err = os.OpenFile(filepath.Join(dir, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	return err
}

// started closes the sandbox's ends, which it now holds.
func (f *startFiles) started() {
	for _, p := range []**os.File{&f.cfgR, &f.syncW, &f.guestConn, &f.console} {
		if *p != nil {
			(*p).Close()
			*p = nil
		}
	}
}

func (f *startFiles) close() {
	f.started()
	for _, p := range []*os.File{f.cfgW, f.syncR, f.hostConn} {
		if p != nil {
			p.Close()
		}
	}
}

// setupError is why a sandbox did not answer its greeting: the error its
// setup wrote on the sync pipe if it wrote one (it then exits, closing the
// pipe), else the greeting's.
func setupError(syncR *os.File, helloErr error) error {
	_ = syncR.SetReadDeadline(time.Now().Add(time.Second))
	b, _ := io.ReadAll(io.LimitReader(syncR, 4096))
	if len(b) > 0 && string(b) != setup.Ready {
		return fmt.Errorf("setup failed: %s", b)
	}
	return fmt.Errorf("the agent did not answer: %w", helloErr)
}

// consoleTail returns the end of a sandbox's console log (its setup
// errors), for error messages.
func consoleTail(dir string) string {
	f, err := os.Open(filepath.Join(dir, "console.log"))
	if err != nil {
		return "no console output"
	}
	defer f.Close()
	fi, _ := f.Stat()
	if fi != nil && fi.Size() > 2048 {
		_, _ = f.Seek(-2048, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "no console output"
	}
	return s
}
