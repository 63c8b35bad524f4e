package daemon

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/audit"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/container"
	"github.com/dsec-dev/dsec/internal/function"
	"github.com/dsec-dev/dsec/internal/guard"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/seccomp"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
	"github.com/dsec-dev/dsec/internal/vm/vmtier"
)

// idCount is how many ids a container sandbox's user namespace maps.
const idCount = 65536

// runtimes builds the tier runtimes this node offers. vmReady, nil
// without the VM tiers, is closed once their guest kernel and initramfs
// are prepared (or their preparation failed: see prepareMicroVM).
func (d *daemon) runtimes(ctx context.Context, layers *layercache.Cache) (*sandbox.Registry, func(), <-chan struct{}, error) {
	var cu cleanup.Stack
	defer cu.Clean()
	reg := sandbox.NewRegistry()
	closeAll := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, rt := range reg.All() {
			if err := rt.Close(ctx); err != nil {
				d.log.Warn("closing runtime", "tier", rt.Tier(), "err", err)
			}
		}
	}
	cu.Add(closeAll)
	// The audit recorder outlives the runtimes (they report to it until
	// they close).
	rec, mon, closeAudit, err := d.startAudit()
	if err != nil {
		return nil, nil, nil, err
	}
	cu.Add(closeAudit)
	d.rec = rec
	fopt := function.Options{
		StateDir: filepath.Join(d.cfg.DataDir, "node", "function"),
		CacheDir: d.cfg.Node.FunctionCacheDir,
		Logger:   d.log.With("tier", "function"),
		PoolSize: d.cfg.Node.FunctionPoolSize,
	}
	if fopt.CacheDir == "" {
		fopt.CacheDir = filepath.Join(d.cfg.DataDir, "cache", "wasm")
	}
	if rec != nil {
		fopt.Audit = rec
	}
	fn, err := function.New(ctx, fopt)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := reg.Register(fn); err != nil {
		return nil, nil, nil, err
	}
	// The VM tiers' networks come from the container tier's network
	// manager, when they run: one range, one nftables table, one deny-set.
	// vmNets[0] is the microvm tier's view, vmNets[1] the vm tier's.
	vmNets := make([]*network.Shared, 2)
	vmTiers := 0
	if !d.cfg.MicroVM.Disabled {
		vmTiers = 1
		if !d.cfg.VM.Disabled {
			vmTiers = 2
		}
	}
	if !d.cfg.Container.Disabled {
		// Without the eBPF monitor the recorder watches nothing, and
		// still records what the node sees itself (a destroy's kills, an
		// agent that died).
		ct, nets, closeDeps, err := d.containerRuntime(ctx, layers, rec, mon, vmTiers)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("container tier (set [container] disabled = true to run without it): %w", err)
		}
		// Runtimes close before their network and cgroup managers.
		cu.Add(closeDeps)
		if err := reg.Register(ct); err != nil {
			return nil, nil, nil, err
		}
		closeRuntimes := closeAll
		closeAll = func() { closeRuntimes(); closeDeps() }
		copy(vmNets, nets)
	}
	// A VM tier's jail (its QEMUs' cgroup parent) closes after the
	// runtimes: with no VM left, its parent goes.
	addJail := func(closeJail func()) {
		cu.Add(closeJail)
		closeRuntimes := closeAll
		closeAll = func() { closeRuntimes(); closeJail() }
	}
	var mv, vm *vmtier.Runtime
	if !d.cfg.MicroVM.Disabled {
		var closeJail func()
		if mv, closeJail, err = d.microvmRuntime(ctx, layers, vmm.MicroVM, vmNets[0], rec); err != nil {
			return nil, nil, nil, fmt.Errorf("microvm tier (set [microvm] disabled = true to run without it): %w", err)
		}
		addJail(closeJail)
		if err := reg.Register(mv); err != nil {
			return nil, nil, nil, err
		}
		if !d.cfg.VM.Disabled {
			if vm, closeJail, err = d.microvmRuntime(ctx, layers, vmm.Q35, vmNets[1], rec); err != nil {
				return nil, nil, nil, fmt.Errorf("vm tier (set [vm] disabled = true to run without it): %w", err)
			}
			addJail(closeJail)
			if err := reg.Register(vm); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	cu.Release()
	var vmReady <-chan struct{}
	if mv != nil {
		// Stopped before the runtimes close.
		stop, ready := d.prepareMicroVM(mv, vm)
		closeRuntimes := closeAll
		closeAll = func() { stop(); closeRuntimes() }
		vmReady = ready
	}
	return reg, func() { closeAll(); closeAudit() }, vmReady, nil
}

// microvmRuntime makes the microvm tier (machine vmm.MicroVM) or the vm
// tier (vmm.Q35). It is registered even without QEMU: its Fingerprint
// then reports it unavailable (and why), and the scheduler places nothing
// on it. nets is its view of the container tier's network manager; nil
// (the container tier disabled) means its VMs have no network, and specs
// that need one are refused. rec, if not nil, records its audit events.
// The function returned closes the tier's jail (removing its cgroup
// parent if no VM's group is left in it) once the runtime has closed.
func (d *daemon) microvmRuntime(ctx context.Context, layers *layercache.Cache, machine vmm.Machine, nets *network.Shared, rec *audit.Recorder) (*vmtier.Runtime, func(), error) {
	c := d.cfg.MicroVM
	tier, timeout, parent := vmtier.Tier, c.BootTimeoutS, c.CgroupParent
	uidBase := c.UIDBase
	if uidBase == 0 {
		uidBase = d.idBase() + idCount // after the container tier's ids
	}
	if machine == vmm.Q35 {
		tier, timeout, parent = vmtier.VMTier, d.cfg.VM.BootTimeoutS, d.cfg.VM.CgroupParent
		uidBase += vmtier.DefaultUIDCount // after the microvm tier's
		if timeout == 0 {
			timeout = 90 // SeaBIOS and PCI enumeration under TCG
		}
	}
	opt := vmtier.Options{
		StateDir: filepath.Join(d.cfg.DataDir, "node", tier),
		CacheDir: c.CacheDir,
		Layers:   vmtier.CacheFiles{Cache: layers},
		Version:  d.build.Version,
		Logger:   d.log.With("tier", tier),
		// "auto" starts on TCG; prepareMicroVM switches to KVM once the
		// guest kernel is seen booting on it.
		Accel:       c.Accelerator,
		BootTimeout: time.Duration(timeout) * time.Second,
		QEMU:        c.QEMU,
		Machine:     machine,
		Upper:       c.Upper,
	}
	if nets != nil {
		opt.Network = nets
	}
	if rec != nil {
		opt.Audit = rec
	}
	if opt.CacheDir == "" {
		opt.CacheDir = filepath.Join(d.cfg.DataDir, "cache", "vmkernel")
	}
	if opt.Accel == "auto" {
		opt.Accel = ""
	}
	closeJail := func() {}
	switch {
	case c.Unjailed:
	case os.Geteuid() != 0:
		// A node that is not root cannot give QEMU another uid or a
		// cgroup; QEMU runs as the node's (unprivileged) user.
		d.log.Warn("not root: QEMU runs unjailed, as the node's user", "tier", tier)
	default:
		jail, err := d.vmJail(ctx, tier, parent, uidBase)
		if err != nil {
			return nil, nil, err
		}
		opt.Jail = jail
		closeJail = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := jail.Cgroups.Close(ctx); err != nil {
				d.log.Warn("closing the VM cgroup manager", "tier", tier, "err", err)
			}
		}
	}
	rt, err := vmtier.New(ctx, opt)
	if err != nil {
		closeJail()
		return nil, nil, err
	}
	return rt, closeJail, nil
}

// vmJail is the Jail of a VM tier's QEMUs: uids from uidBase, a cgroup
// parent of the tier's own (devices: the defaults and /dev/kvm), and the
// data directory made searchable (not listable) so that each QEMU reaches
// its run directory under <data_dir>/node/<tier>.
func (d *daemon) vmJail(ctx context.Context, tier, parent string, uidBase int) (*vmtier.Jail, error) {
	c := d.cfg.MicroVM
	if parent == "" {
		parent = "dsec-" + tier
	}
	cg, err := cgroups.New(ctx, cgroups.Options{Parent: parent, Devices: []string{"c 10:232 rwm"}, Logger: d.log.With("part", "cgroups", "tier", tier)})
	if err != nil {
		return nil, fmt.Errorf("cgroups (set [microvm] unjailed = true to run QEMU without): %w", err)
	}
	for _, dir := range []string{d.cfg.DataDir, filepath.Join(d.cfg.DataDir, "node")} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	return &vmtier.Jail{
		UIDBase: uint32(uidBase), UIDCount: vmtier.DefaultUIDCount,
		Cgroups: cg, OverheadMiB: c.MemoryOverheadMiB, Pids: int64(c.Pids),
	}, nil
}

// prepareMicroVM fetches the guest kernel and builds the initramfs (for
// the microvm tier mv and, if not nil, the vm tier vm, which share them)
// in the background, closing ready when that is done or has failed; the
// node's start waits for it (waitGuestKernel), so that no create waits
// for the fetch. It then, with accelerator "auto", probes whether the
// kernel boots on KVM (vmm.ProbeAccel) and, if it does, switches the tier
// to it. The node reports the tier's accelerator in its tiers (GET
// /v1/nodes). A failure is logged: the first create tries the fetch
// again, and reports it. stop stops the work and waits for it.
func (d *daemon) prepareMicroVM(mv, vm *vmtier.Runtime) (stop func(), ready <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	done, prepared := make(chan struct{}), make(chan struct{})
	log := d.log.With("tier", vmtier.Tier)
	go func() {
		defer close(done)
		kernel, ok := d.prepareGuestKernel(ctx, log, mv, vm)
		close(prepared)
		if !ok {
			return
		}
		if a := d.cfg.MicroVM.Accelerator; a != "" && a != "auto" {
			return
		}
		accel, err := vmm.ProbeAccel(ctx, d.cfg.MicroVM.QEMU, kernel)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("probing the accelerator: microvms run on TCG", "err", err)
			}
			return
		}
		mv.UseAccel(accel)
		if vm != nil {
			vm.UseAccel(accel) // the same kernel on the same host
		}
		log.Info("microvm accelerator", "accel", accel)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}, prepared
}

// prepareGuestKernel prepares the VM tiers' boot files (see
// prepareMicroVM) and returns the kernel's path, or false if the tier is
// unavailable or the preparation failed (logged).
func (d *daemon) prepareGuestKernel(ctx context.Context, log *slog.Logger, mv, vm *vmtier.Runtime) (string, bool) {
	if info := mv.Fingerprint(ctx); !info.Available {
		log.Warn("the microvm tier is unavailable", "reason", info.Reason)
		return "", false
	}
	kernel, err := mv.Prepare(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("preparing the guest kernel (the first microvm create tries again)", "err", err)
		}
		return "", false
	}
	if vm != nil {
		if _, err := vm.Prepare(ctx); err != nil && ctx.Err() == nil {
			log.Warn("preparing the vm tier's boot files (its first create tries again)", "err", err)
		}
	}
	return kernel, true
}

// guestKernelWait bounds how long a node's start waits for the VM tiers'
// guest kernel. The first start on an empty kernel cache fetches it from
// the apt mirror (12–20 s here; minutes on a slow link); later starts find
// it cached (about 2 s here: the apt index lookup and the files'
// digests). A node still preparing it then serves anyway: its first VM
// creates wait for the same preparation. A variable for tests.
var guestKernelWait = 2 * time.Minute

// waitGuestKernel holds the node's start until ready is closed (the
// guest kernel and initramfs prepared: prepareMicroVM), up to
// guestKernelWait or until ctx ends. ready may be nil (no VM tiers).
func (d *daemon) waitGuestKernel(ctx context.Context, ready <-chan struct{}) {
	if ready == nil {
		return
	}
	start := time.Now()
	d.log.Info("preparing the VM tiers' guest kernel before serving (the first start fetches it from the apt mirror: tens of seconds)")
	t := time.NewTimer(guestKernelWait)
	defer t.Stop()
	select {
	case <-ready:
		d.log.Info("the VM tiers' guest kernel is ready", "took", time.Since(start).Round(time.Millisecond))
	case <-t.C:
		d.log.Warn("the VM tiers' guest kernel is still being prepared: serving now; the first microvm and vm creates wait for it", "waited", guestKernelWait)
	case <-ctx.Done():
	}
}

// containerRuntime makes the container tier and the network and cgroup
// managers it needs; the function returned closes those managers. It
// also returns vmTiers views of the network manager for the VM tiers
// (network.Shared: each tier's Recover keeps the others' networks).
func (d *daemon) containerRuntime(ctx context.Context, layers *layercache.Cache, rec *audit.Recorder, mon *monitor.Monitor, vmTiers int) (*container.Runtime, []*network.Shared, func(), error) {
	c := d.cfg.Container
	var cu cleanup.Stack
	defer cu.Clean()
	cg, err := cgroups.New(ctx, cgroups.Options{Parent: c.CgroupParent, Logger: d.log.With("part", "cgroups")})
	if err != nil {
		return nil, nil, nil, err
	}
	nopt := network.Options{Name: c.Name, PoolSize: c.NetworkPool, Reuse: c.NetworkReuse, HostIfaces: c.Uplinks, Logger: d.log.With("part", "network")}
	if c.NetworkRange != "" {
		if nopt.Range, err = netip.ParsePrefix(c.NetworkRange); err != nil {
			return nil, nil, nil, fmt.Errorf("[container] network_range: %w", err)
		}
	}
	nets, err := network.New(ctx, nopt)
	if err != nil {
		return nil, nil, nil, err
	}
	closeGuard := d.attachGuard(cg.Parent2(), nets.Resolvers())
	cu.Add(closeGuard)
	closeNets := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Live sandboxes keep their networks (re-adopted next start).
		if err := nets.Close(ctx); err != nil {
			d.log.Warn("closing the network manager", "err", err)
		}
		// Groups kept for reuse go; those of live sandboxes stay.
		if err := cg.Close(ctx); err != nil {
			d.log.Warn("closing the cgroup manager", "err", err)
		}
		closeGuard()
	}
	cu.Add(closeNets)
	views := nets.Share(1 + vmTiers)
	ctNets, vmNets := views[0], views[1:]
	copt := container.Options{
		StateDir: filepath.Join(d.cfg.DataDir, "node", "container"),
		DataDir:  d.cfg.DataDir, Reach: []string{filepath.Join(d.cfg.DataDir, "layers")},
		Layers: layers, Network: ctNets, Cgroups: cg,
		Seccomp: func(caps []string) ([]byte, error) { return seccomp.Program(seccomp.Options{Caps: caps}) },
		Logger:  d.log.With("tier", container.Tier),
		HostUID: d.idBase(), HostGID: d.idBase(), IDCount: idCount,
		Version:    d.build.Version,
		Warm:       warmPool(c.WarmPool, 2),
		WarmAgents: warmPool(c.WarmAgents, 16),
	}
	if rec != nil {
		copt.Monitor = rec
	}
	if mon != nil {
		copt.Exec = mon // enforces phases' allowed executables
	}
	ct, err := container.New(ctx, copt)
	if err != nil {
		return nil, nil, nil, err
	}
	cu.Release()
	return ct, vmNets, closeNets, nil
}

// startAudit starts the recorder of audit events (nil if [audit] is
// disabled) and, where its programs load, the eBPF monitor feeding it
// (mon, nil where they do not). Without the monitor, container sandboxes run unmonitored
// under the same host-side rules; the function tier reports its file
// system events either way. The function returned stops both.
func (d *daemon) startAudit() (rec *audit.Recorder, mon *monitor.Monitor, stop func(), err error) {
	none := func() {}
	a := d.cfg.Audit
	if a.Disabled {
		d.info.Monitor = "off"
		return nil, nil, none, nil
	}
	rules, err := audit.LoadRules(a.Rules)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("[audit] rules: %w", err)
	}
	rules = append([]audit.Rule{audit.NodeRule(d.nodePrefixes())}, rules...)
	js, err := jetstream.New(d.nc)
	if err != nil {
		return nil, nil, nil, err
	}
	sink := audit.JetStreamSink{JS: js}
	log := d.log.With("part", "audit")
	if d.cfg.Container.Disabled {
		return audit.NewRecorder(nil, rules, sink, log), nil, none, nil
	}
	mon, err = monitor.Start(d.log.With("part", "monitor"))
	if err != nil {
		d.log.Warn("the eBPF monitor cannot run here: container sandboxes run unmonitored (their host-side rules are unchanged)", "err", err)
		d.info.Monitor = "unavailable: " + err.Error()
		return audit.NewRecorder(nil, rules, sink, log), nil, none, nil
	}
	rec = audit.NewRecorder(mon, rules, sink, log)
	d.info.Monitor = "on"
	var once sync.Once
	return rec, mon, func() {
		once.Do(func() {
			mon.Close()
			rec.Wait()
		})
	}, nil
}

// nodePrefixes are the node's own addresses (its interfaces', loopback
// aside: a sandbox's 127.0.0.1 is its own) and its sandbox network.
func (d *daemon) nodePrefixes() []netip.Prefix {
	out := []netip.Prefix{network.DefaultRange, netip.PrefixFrom(network.DefaultGateway, 32)}
	if r, err := netip.ParsePrefix(d.cfg.Container.NetworkRange); err == nil {
		out[0] = r
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && !ip.Unmap().IsLoopback() {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// attachGuard attaches the cgroup-bpf guard to the sandboxes' cgroup2
// parent (every sandbox's group inherits it) and returns what detaches
// it. Where it cannot attach, sandboxes keep nftables' and seccomp's
// refusals of the same things; the node's status says so. The links are
// pinned under the tier's network name: sandboxes that outlive the
// agent (kept, or a crash) stay guarded, and the next agent takes the
// links over; the function returned leaves them while a sandbox's group
// remains below the parent, and removes them once none does.
func (d *daemon) attachGuard(parent2 string, dns []netip.Addr) func() {
	if parent2 == "" {
		d.info.Guard = "unavailable: no cgroup2 hierarchy"
		return func() {}
	}
	name := d.cfg.Container.Name
	if name == "" {
		name = network.DefaultName
	}
	g, err := guard.Attach(parent2, guard.Options{Deny: guard.DefaultDeny, DNS: dns, PinDir: guard.PinDir(name)})
	if err != nil {
		d.log.Warn("the cgroup-bpf guard cannot attach: nftables and seccomp still refuse metadata addresses and raw sockets", "err", err)
		d.info.Guard = "unavailable: " + err.Error()
		return func() {}
	}
	d.info.Guard = "on"
	var once sync.Once
	return func() {
		once.Do(func() {
			ents, _ := os.ReadDir(parent2)
			if slices.ContainsFunc(ents, fs.DirEntry.IsDir) {
				if err := g.Keep(); err != nil {
					d.log.Warn("releasing the cgroup-bpf guard", "err", err)
				}
				return
			}
			if err := g.Close(); err != nil {
				d.log.Warn("detaching the cgroup-bpf guard", "err", err)
			}
		})
	}
}

// warmPool is a warm pool's size for its setting: 0 means def, a
// negative value none.
func warmPool(n, def int) int {
	switch {
	case n == 0:
		return def
	case n < 0:
		return 0
	}
	return n
}

func (d *daemon) idBase() int {
	if d.cfg.Container.IDBase > 0 {
		return d.cfg.Container.IDBase
	}
	return container.DefaultIDBase
}

// idMap is the layer cache's id mapping for container roots (nil with the
// tier off), and a function that releases it.
func (d *daemon) idMap() (*layercache.IDMap, func(), error) {
	if d.cfg.Container.Disabled {
		return nil, func() {}, nil
	}
	fd, err := sys.NewUserns(d.idBase(), d.idBase(), idCount)
	if err != nil {
		return nil, nil, fmt.Errorf("container tier (set [container] disabled = true to run without it): %w", err)
	}
	return &layercache.IDMap{UsernsFd: fd, HostUID: d.idBase(), HostGID: d.idBase()},
		func() { _ = sys.CloseFd(fd) }, nil
}
