package setup

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// SetupSandbox must run on a goroutine locked to its OS thread, which
// must then fork every command (see dropBounding).
//
// SetupSandbox turns this process, just cloned by the node into new user,
// mount, pid, uts, ipc and cgroup namespaces (and joined to the sandbox's
// network namespace), into the sandbox's PID 1: it builds the root file
// system view, pivots into it, sheds every privilege commands must not
// have and returns the agent's listener. Nothing from the sandbox has run
// yet: this is trusted code from the read-only toolkit layer.
//
// With cfg.Deferred (a warm agent of no image yet), the steps that need
// no root run first; the process then tells the node it waits (Waiting on
// first) and reads its root and the rest of its config from first
// (receiveRoot) when a create claims it.
func SetupSandbox(cfgFile *os.File, first *net.UnixConn) (net.Listener, SandboxConfig, error) {
	b, err := io.ReadAll(io.LimitReader(cfgFile, 16<<20))
	cfgFile.Close()
	if err != nil {
		return nil, SandboxConfig{}, fmt.Errorf("reading the sandbox config: %w", err)
	}
	cfg, err := DecodeSandboxConfig(b)
	if err != nil {
		return nil, cfg, fmt.Errorf("decoding the sandbox config: %w", err)
	}
	// The root's descriptor is the one the node hands us on purpose:
	// closeInherited must not close it (it is closed once attached).
	rootFD := cfg.RootFD
	if rootFD != 0 {
		sys.CloseOnExec(rootFD)
	}
	root := cfg.Rootfs
	var mask masker
	var ln net.Listener
	steps := []struct {
		what string
		fn   func() error
	}{
		// Before anything else: what the node leaked to us must not
		// reach the sandbox (see closeInherited).
		{"closing inherited descriptors", closeInherited},
		// The node has placed us in our cgroups by now (we read the config
		// only after): a new cgroup namespace roots our view there.
		{"entering a cgroup namespace", func() error { return sys.Unshare(syscall.CLONE_NEWCGROUP) }},
		// Nothing we mount propagates back to the host.
		{"making mounts private", func() error { return sys.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "") }},
		{"bringing up the loopback network", func() error {
			if !cfg.OwnNetwork {
				return nil
			}
			return ownNetwork(cfg.NetSysctls)
		}},
		// A deferred setup listens before it waits, so that its claim
		// need not (~4 ms of a bind on a process idle till then).
		// The socket stays the sandbox's as its directory is renamed.
		{"listening for the node", func() error {
			if !cfg.Deferred {
				return nil
			}
			var err error
			ln, err = listen(cfg.SockDir)
			// Its threads too (~2 ms): the filter and the capability
			// drop below reach every thread.
			reserveThreads(reservedThreads)
			return err
		}},
		{"waiting for the root", func() error {
			if !cfg.Deferred {
				return nil
			}
			fd, err := receiveRoot(first, &cfg)
			rootFD, root = fd, cfg.Rootfs
			return err
		}},
		{"attaching the root", func() error {
			if rootFD == 0 {
				return nil
			}
			err := sys.MoveMount(rootFD, root)
			_ = sys.CloseFd(rootFD)
			return err
		}},
		{"setting the hostname", func() error { return sys.Sethostname(cfg.Hostname) }},
		// pivot_root needs the new root to be a mount point of ours (the
		// overlay is locked, inherited from a more privileged namespace).
		// An attached root is one already.
		{"binding the root", func() error {
			if rootFD != 0 {
				return nil
			}
			return sys.Mount(root, root, "", syscall.MS_BIND|syscall.MS_REC, "")
		}},
		// From here paths are relative to the root (now a mount, so the
		// working directory is on it): the node's state directory is many
		// components deep, and walking it ~40 times was ~2 % of the
		// agent's CPU (path walks 5.8 → 3.8 %).
		{"entering the root", func() error {
			if err := os.Chdir(root); err != nil {
				return err
			}
			root = "."
			return nil
		}},
		// proc must be mounted while the host's proc is still visible
		// (mnt_already_visible refuses it after the old root is gone).
		{"mounting /proc", func() error { return mountAt(root, "proc", "proc", "proc", nosuidNodevNoexec, "") }},
		{"building /dev", func() error { return buildDev(root, cfg.ShmBytes) }},
		{"mounting /sys", func() error { return bindSys(root, &mask) }},
		{"masking /proc", func() error { return maskProc(root, &mask) }},
		{"writing /etc", func() error { return writeEtc(root, cfg) }},
		// Commands start there, and the files API resolves relative
		// paths against it, on every tier.
		{"making the working directory", func() error { return sandbox.MakeWorkdir(root) }},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			if ln != nil {
				ln.Close()
			}
			return nil, cfg, fmt.Errorf("%s: %w", s.what, err)
		}
	}
	if ln == nil {
		if ln, err = listen(cfg.SockDir); err != nil {
			return nil, cfg, fmt.Errorf("listening for the node: %w", err)
		}
	}
	if err := sys.PivotRoot(root); err != nil {
		ln.Close()
		return nil, cfg, fmt.Errorf("pivoting into the root: %w", err)
	}
	if err := dropBounding(cfg.KeepCaps); err != nil {
		ln.Close()
		return nil, cfg, err
	}
	if err := noRoot(); err != nil {
		ln.Close()
		return nil, cfg, err
	}
	if err := installSeccomp(cfg.Seccomp); err != nil {
		ln.Close()
		return nil, cfg, err
	}
	if err := dropAgentCaps(cfg.KeepCaps); err != nil {
		ln.Close()
		return nil, cfg, err
	}
	// The zygote started us on one CPU (see zygoteStart): the agent and
	// the commands it forks may now run on any. Threads started from
	// here on inherit that.
	if err := sys.UnpinThreads(); err != nil {
		ln.Close()
		return nil, cfg, err
	}
	if !cfg.Deferred {
		reserveThreads(reservedThreads)
	}
	return ln, cfg, nil
}

// listen makes the agent's socket in dir.
func listen(dir string) (net.Listener, error) {
	return net.Listen("unix", filepath.Join(dir, SockName))
}

// reservedThreads is how many idle OS threads the agent starts with.
const reservedThreads = 6

// reserveThreads makes the Go runtime start n OS threads now and leaves
// them idle. The runtime keeps idle threads, takes one whenever a
// goroutine blocks in a system call, and starts a new one only when none
// is idle; if it cannot (EAGAIN), it dies ("failed to create new OS
// thread"). A fork bomb in the sandbox holds every pid its pids.max
// allows, so without threads in reserve it killed the agent, PID 1, and
// the sandbox with it (found by the isolation test A45). Each thread
// costs the runtime about 20 KiB.
func reserveThreads(n int) {
	var locked, unlocked sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	unlocked.Add(n)
	for range n {
		go func() {
			defer unlocked.Done()
			// Locked, each goroutine holds a thread of its own until all
			// are; unlocked before it returns, the thread goes idle (a
			// goroutine that exits locked takes its thread with it).
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	unlocked.Wait()
}

const nosuidNodevNoexec = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC

// closeInherited closes every descriptor above 4 this process inherited:
// the node hands it 0-5 (the caller has taken 5 over by now), but exec
// passes on every descriptor of the node that lacks close-on-exec, such
// as one the node's own parent leaked to it. A directory among them leads
// out of the sandbox: a command started with its working directory at
// /proc/self/fd/N enters it before it execs (CVE-2024-21626, where runc
// leaked a cgroupfs directory; found by the isolation test A2). Go opens
// every descriptor close-on-exec, so those without it were inherited.
func closeInherited() error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd <= 4 {
			continue
		}
		if cloexec, err := sys.HasCloseOnExec(fd); err != nil || cloexec {
			continue // closed meanwhile (the listing's own), or ours
		}
		if err := sys.CloseFd(fd); err != nil {
			return fmt.Errorf("closing descriptor %d: %w", fd, err)
		}
	}
	return nil
}

func mountAt(root, rel, source, fstype string, flags uintptr, data string) error {
	target := filepath.Join(root, rel)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	return sys.Mount(source, target, fstype, flags, data)
}

// bindFile bind-mounts the host file src onto root/rel (created empty).
func bindFile(root, rel, src string, flags uintptr) error {
	target := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o666); err == nil {
		f.Close()
	} else if !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := sys.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s: %w", src, err)
	}
	flags |= syscall.MS_NOSUID | syscall.MS_NOEXEC
	if flags != 0 {
		return sys.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|flags, "")
	}
	return nil
}

// buildDev gives the sandbox a minimal /dev: a tmpfs with the host's
// harmless character devices bound in (mknod is not allowed in a user
// namespace), its own devpts and a size-capped /dev/shm.
func buildDev(root string, shmBytes int64) error {
	if err := mountAt(root, "dev", "tmpfs", "tmpfs", syscall.MS_NOSUID|syscall.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindFile(root, "dev/"+d, "/dev/"+d, 0); err != nil {
			return err
		}
	}
	if err := mountAt(root, "dev/pts", "devpts", "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if shmBytes <= 0 {
		shmBytes = 64 << 20
	}
	if err := mountAt(root, "dev/shm", "shm", "tmpfs", nosuidNodevNoexec, "mode=1777,size="+strconv.FormatInt(shmBytes, 10)); err != nil {
		return err
	}
	for link, target := range map[string]string{
		"dev/ptmx": "pts/ptmx", "dev/fd": "/proc/self/fd", "dev/stdin": "/proc/self/fd/0",
		"dev/stdout": "/proc/self/fd/1", "dev/stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return err
		}
	}
	return nil
}

// bindSys shows the host's /sys read-only, with the parts that say too
// much about the host (or could be written through a writable submount)
// masked by empty read-only tmpfs. A fresh sysfs cannot be mounted: the
// network namespace is not owned by the sandbox's user namespace. So the
// network devices sysfs shows are the node's, not the sandbox's: among
// them every sandbox's veth, named after its address (found by the
// isolation test A34); they are masked too.
func bindSys(root string, m *masker) error {
	target := filepath.Join(root, "sys")
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := sys.Mount("/sys", target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return err
	}
	if err := sys.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|nosuidNodevNoexec, ""); err != nil {
		return err
	}
	for _, d := range []string{"fs/cgroup", "firmware", "kernel/security", "kernel/debug", "kernel/tracing", "fs/bpf", "fs/fuse/connections", "devices/virtual/powercap", "class/net", "devices/virtual/net"} {
		if err := m.dir(filepath.Join(target, d)); err != nil {
			return fmt.Errorf("masking /sys/%s: %w", d, err)
		}
	}
	return nil
}

// ownNetwork sets up a network namespace of the sandbox's own (lo
// alone): sysctls (network.LoopbackSysctls), then lo up. Sandbox root
// (this process) owns the namespace; commands, which hold no
// capability, can change nothing in it.
func ownNetwork(sysctls [][2]string) error {
	for _, kv := range sysctls {
		if err := os.WriteFile("/proc/sys/net/"+kv[0], []byte(kv[1]), 0); err != nil {
			return fmt.Errorf("sysctl net/%s: %w", kv[0], err)
		}
	}
	return sys.SetLinkUp("lo")
}

// masker hides directories under an empty read-only tmpfs: one tmpfs,
// mounted on the first and bound onto the others (a superblock made and
// torn down per masked directory cost every sandbox ~20 µs each way).
type masker struct{ first string }

// A path this kernel lacks, or that is not a directory here, has
// nothing to hide: the mount's own error says so, without a stat first.
func (m *masker) dir(path string) error {
	if m.first == "" {
		err := sys.Mount("tmpfs", path, "tmpfs", syscall.MS_RDONLY|nosuidNodevNoexec, "size=0")
		if err == nil {
			m.first = path
		}
		return absent(err)
	}
	// The bind keeps the mount's flags (read-only, nosuid, nodev,
	// noexec), and the tmpfs itself is read-only.
	return absent(sys.Mount(m.first, path, "", syscall.MS_BIND, ""))
}

// absent is err, or nil if it says the target does not exist or is not
// a directory.
func absent(err error) error {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	return err
}

// maskProc hides and write-protects /proc paths as OCI runtimes do.
func maskProc(root string, m *masker) error {
	proc := filepath.Join(root, "proc")
	for _, p := range []string{"kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "sysrq-trigger", "kallsyms", "interrupts"} {
		err := sys.Mount("/dev/null", filepath.Join(proc, p), "", syscall.MS_BIND, "")
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("masking /proc/%s: %w", p, err)
		}
	}
	for _, d := range []string{"acpi", "asound", "scsi", "driver"} {
		if err := m.dir(filepath.Join(proc, d)); err != nil {
			return fmt.Errorf("masking /proc/%s: %w", d, err)
		}
	}
	for _, p := range []string{"bus", "fs", "irq", "sys"} {
		path := filepath.Join(proc, p)
		err := sys.Mount(path, path, "", syscall.MS_BIND|syscall.MS_REC, "")
		if errors.Is(err, syscall.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("protecting /proc/%s: %w", p, err)
		}
		if err := sys.Mount("", path, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|nosuidNodevNoexec, ""); err != nil {
			return fmt.Errorf("protecting /proc/%s: %w", p, err)
		}
	}
	return nil
}

// writeEtc writes the sandbox's name and resolver files (into its upper
// layer: they are the sandbox's own).
func writeEtc(root string, cfg SandboxConfig) error {
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	for name, content := range map[string]string{"hosts": cfg.Hosts, "resolv.conf": cfg.ResolvConf, "hostname": cfg.Hostname + "\n"} {
		if err := writeOwn(filepath.Join(etc, name), content); err != nil {
			return err
		}
	}
	return nil
}

// writeOwn writes content to p, replacing a symlink there (debian's
// resolv.conf may be one) rather than writing where it leads. A regular
// file is truncated in place: removing it first made the overlay write a
// whiteout and then create over it, three times in every sandbox's
// start.
func writeOwn(p, content string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
	if errors.Is(err, syscall.ELOOP) {
		if err := os.Remove(p); err != nil {
			return err
		}
		f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	return errors.Join(err, f.Close())
}

// capLastCap is CAP_LAST_CAP where /proc does not say.
const capLastCap = 40

// dropBounding empties the capability bounding set but for keep, on the
// calling thread: the bounding set is per thread, and the agent forks
// every command from this one (agent.Options.Fork). Dropping it on every
// thread (AllThreadsSyscall, a stop-the-world per capability) cost 1.1 to
// 2.9 ms per sandbox here; on one thread it is 41 plain prctl calls. The
// process keeps the capabilities it holds (it needs them to manage
// commands); what it starts gains at most keep, even as root.
func dropBounding(keep []int) error {
	k := map[int]bool{}
	for _, c := range keep {
		k[c] = true
	}
	last := capLastCap
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(string(trimNL(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if k[c] {
			continue
		}
		if err := sys.DropBoundingCap(c); err != nil {
			return fmt.Errorf("dropping capability %d: %w", c, err)
		}
	}
	return nil
}

// noRoot sets SECBIT_NOROOT, locked, on the calling thread (the one that
// forks every command, which inherits it): executing a program as root
// then grants no capability of itself, so a command holds exactly the
// ambient capabilities the agent starts it with (its phase's), whatever
// its uid. Without it root's exec would grant the whole bounding set.
func noRoot() error {
	if err := sys.SetThreadNoRoot(); err != nil {
		return fmt.Errorf("setting SECBIT_NOROOT: %w", err)
	}
	return nil
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
