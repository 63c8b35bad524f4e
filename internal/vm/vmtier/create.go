package vmtier

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vm/vmconfig"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// Files of a VM's run directory besides vmm's sockets and log.
const (
	configDisk = "config.img"
)

// defaultUpperMiB sizes the upper layer when the spec gives no disk size.
const defaultUpperMiB = 256

// Create implements sandbox.Runtime.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	policy, linked, err := r.check(spec)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	k, initrd, err := r.bootFiles(ctx, spec.Image.Layers)
	if err != nil {
		return nil, err
	}
	var cu cleanup.Stack
	defer cu.Clean()

	files, release, err := r.opt.Layers.Files(ctx, spec.Image.Layers)
	if err != nil {
		return nil, err
	}
	cu.Add(release)

	dir := filepath.Join(r.opt.StateDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s already has a run directory", spec.ID)
		}
		return nil, err
	}
	cu.Add(func() { os.RemoveAll(dir) })

	// A VM that may reach nothing, in any phase, gets no NIC: no
	// namespace, tap, veth or firewall element, and its guest loads no
	// network driver (the default, and the fastest boot).
	var ep *network.Endpoint
	var tap *os.File
	var mtu int
	var netTime, upperTime time.Duration
	if linked {
		s := time.Now()
		if ep, err = r.opt.Network.Acquire(ctx, spec.ID, policy); err != nil {
			return nil, err
		}
		cu.Add(func() {
			if err := r.releaseNetwork(context.Background(), spec.ID, ep.NetnsPath); err != nil {
				r.log.Warn("releasing the network of a failed create", "id", spec.ID, "err", err)
			}
		})
		if tap, mtu, err = plugTap(ep.NetnsPath); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, api.CodeNetworkSetupFailed, err, "plugging the VM of %s into its network", spec.ID)
		}
		defer tap.Close() // QEMU has its own once started
		netTime = time.Since(s)
	}

	cfg := vmconfig.Config{
		UpperMiB: spec.DiskMB,
		Hostname: agentsandbox.Hostname(spec.ID),
		Env:      agentsandbox.BaseEnv(agentsandbox.CommandEnv(spec, nil)),
		Hosts:    agentsandbox.HostsFile(spec.ID, ep),
		Resolv:   agentsandbox.ResolvConf(ep),
		Init:     r.opt.Machine == vmm.Q35, // the image's init system, if systemd
	}
	if ep != nil {
		cfg.Net = &vmconfig.Net{Addr: ep.Addr.String(), MAC: ep.MAC.String(), Gateway: ep.Gateway.String(),
			GatewayMAC: ep.GatewayMAC.String(), MTU: mtu}
	}
	if cfg.UpperMiB <= 0 {
		cfg.UpperMiB = defaultUpperMiB
	}
	disks := []vmm.Disk{{Path: filepath.Join(dir, configDisk), Serial: vmconfig.DiskSerial}}
	for i, f := range files {
		meta, blob := vmconfig.LayerSerials(i)
		cfg.Layers = append(cfg.Layers, vmconfig.Layer{Meta: meta, Blob: blob})
		disks = append(disks,
			vmm.Disk{Path: f.Meta, Serial: meta},
			vmm.Disk{Path: f.Blob, Serial: blob})
	}
	var upper *vmm.Disk
	if r.upperKind() == UpperDisk {
		s := time.Now()
		p, err := r.makeUpper(ctx, dir, cfg.UpperMiB)
		if err != nil {
			return nil, err
		}
		upper, cfg.UpperDisk = &vmm.Disk{Path: p, Serial: vmconfig.UpperSerial}, vmconfig.UpperSerial
		upperTime = time.Since(s)
	}
	b, err := cfg.Encode()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(disks[0].Path, b, 0o600); err != nil {
		return nil, err
	}

	vmcfg := vmm.Config{
		Name:          spec.ID,
		Machine:       r.opt.Machine,
		Accel:         r.accelerator(),
		CPUs:          vcpus(spec.CPU),
		MemoryMiB:     max(spec.MemoryMB, minMemoryMiB),
		Kernel:        k.VmlinuxPath(),
		Initrd:        initrd,
		Cmdline:       r.cmdline(),
		Disks:         disks,
		Writable:      upper,
		Agent:         true,
		RunDir:        dir,
		Binary:        r.opt.QEMU,
		ShutdownGrace: shutdownGrace,
	}
	st := state{Spec: spec}
	if ep != nil {
		vmcfg.TapFD, vmcfg.TapFile, vmcfg.MAC = true, tap, ep.MAC.String()
		st.Netns = ep.NetnsPath
	}
	var unjail func()
	var group *cgroups.Group
	if r.opt.Jail != nil {
		g, undo, err := r.jailVM(ctx, spec.ID, dir, &vmcfg)
		if err != nil {
			return nil, err
		}
		unjail, group = undo, g
		cu.Add(undo)
		vmcfg.Paused = g != nil // until QEMU is in its cgroup
	}
	vm, err := vmm.Start(ctx, vmcfg)
	if err != nil {
		return nil, err
	}
	cu.Add(func() { vm.Kill(context.Background()) })
	contAt := vm.Started.Cont
	if group != nil {
		if contAt, err = enterCgroup(ctx, group, vm); err != nil {
			return nil, err
		}
		vmcfg.Paused = false // the state file's: the VM runs
	}
	st.Pid, st.VM = vm.Pid, vmcfg
	if err := writeState(dir, st); err != nil {
		return nil, err
	}

	var client *agentproto.Client
	tm := Timing{Network: netTime, Upper: upperTime, Spawn: vm.Started.Spawn.Sub(t0), QMP: vm.Started.QMP.Sub(t0), Cont: contAt.Sub(t0)}
	err = vm.WaitReady(ctx, func(ctx context.Context) error {
		c, err := dialAgent(ctx, vm.AgentSocket(), r, &tm, t0)
		client = c
		return err
	}, r.opt.BootTimeout)
	if err != nil {
		return nil, err
	}
	cu.Add(func() { client.Close() })
	r.log.Debug("microvm ready", "id", spec.ID, "network", tm.Network, "upper", tm.Upper, "spawn", tm.Spawn, "qmp", tm.QMP, "cont", tm.Cont, "connected", tm.Connected, "hello", tm.Hello)

	sb := &Sandbox{id: spec.ID, rt: r, spec: spec, dir: dir, vm: vm, netns: st.Netns, agent: agentsandbox.NewAgent(r.Tier(), spec.ID, client), release: release, timing: tm, unjail: unjail,
		upperDisk: upper != nil, gone: make(chan struct{})}
	if err := sb.startPhase(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errdefs.New(errdefs.Unavailable, api.CodeRuntimeClosed, "the microvm runtime is closed")
	}
	if _, ok := r.sandboxes[spec.ID]; ok {
		return nil, errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s exists", spec.ID)
	}
	r.sandboxes[spec.ID] = sb
	cu.Release()
	sb.watchVM()
	return sb, nil
}

// check refuses what this slice of the tier cannot do, and returns the
// network policy the VM starts with and whether it needs a NIC.
func (r *Runtime) check(spec sandbox.Spec) (network.Policy, bool, error) {
	if len(spec.Image.Layers) == 0 {
		return network.Policy{}, false, errdefs.New(errdefs.Invalid, api.CodeImageWithoutLayers, "the %s tier runs images built from layers; %s has none", r.Tier(), spec.Image.Name)
	}
	if len(spec.Image.Layers) > maxLayers {
		return network.Policy{}, false, errdefs.New(errdefs.Invalid, api.CodeTooManyLayers, "%d layers: the %s tier takes at most %d", len(spec.Image.Layers), r.Tier(), maxLayers)
	}
	policy, linked, err := network.Initial(spec.Network, spec.Phases)
	if err != nil {
		return policy, false, err
	}
	for _, p := range spec.Phases {
		if err := checkPhaseEnforceable(spec, p); err != nil {
			return policy, false, err
		}
	}
	if linked && r.opt.Network == nil {
		return policy, false, sandbox.Unsupported(r.Tier(), "network egress (no network manager on this node)")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return policy, false, errdefs.New(errdefs.Unavailable, api.CodeRuntimeClosed, "the microvm runtime is closed")
	}
	if _, ok := r.sandboxes[spec.ID]; ok {
		return policy, false, errdefs.New(errdefs.Conflict, api.CodeSandboxExists, "sandbox %s exists", spec.ID)
	}
	return policy, linked, nil
}

// maxLayers keeps the disks within vmm's 24 (two per layer and the
// config disk).
const maxLayers = 11

// vcpus maps a CPU share to whole vCPUs: at least one, at most the host's.
func vcpus(cpu float64) int {
	n := int(math.Ceil(cpu))
	return min(max(n, 1), runtime.NumCPU())
}

// dialAgent connects to the agent's port and waits for its hello: the
// readiness check of a boot. QEMU accepts the connection at once and
// holds the hello until the guest's agent opens its end of the port.
func dialAgent(ctx context.Context, sock string, r *Runtime, tm *Timing, t0 time.Time) (*agentproto.Client, error) {
	c, err := agentsandbox.Dial(ctx, sock, r.log, func() { tm.Connected = time.Since(t0) })
	if err == nil {
		tm.Hello = time.Since(t0)
	}
	return c, err
}

// Timing is when a Create passed its steps, from its start (after the
// spec's checks): for measurements and debug logs.
type Timing struct {
	Network   time.Duration // how long acquiring the network and plugging the tap took (not an offset)
	Upper     time.Duration // how long making the upper disk took (not an offset)
	Spawn     time.Duration // QEMU's process started
	QMP       time.Duration // its QMP answered
	Cont      time.Duration // the guest was let run
	Connected time.Duration // agent.sock accepted the connection
	Hello     time.Duration // the agent answered hello: ready
}
