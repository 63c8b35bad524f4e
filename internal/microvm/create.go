package microvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/dsec-dev/dsec/internal/agentproto"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vmconfig"
	"github.com/dsec-dev/dsec/internal/vmm"
)

// Files of a VM's run directory besides vmm's sockets and log.
const (
	configDisk = "config.img"
)

// defaultUpperMiB sizes the upper tmpfs when the spec gives no disk size.
const defaultUpperMiB = 256

// Create implements sandbox.Runtime.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := r.check(spec); err != nil {
		return nil, err
	}
	t0 := time.Now()
	k, initrd, err := r.boot(ctx)
	if err != nil {
		return nil, err
	}
	var cu cleanup.Stack
	defer cu.Clean()

	dirs, release, err := r.opt.Layers.LayerDirs(ctx, spec.Image.Layers)
	if err != nil {
		return nil, err
	}
	cu.Add(release)

	dir := filepath.Join(r.opt.StateDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.New(errdefs.Conflict, "sandbox_exists", "sandbox %s already has a run directory", spec.ID)
		}
		return nil, err
	}
	cu.Add(func() { os.RemoveAll(dir) })

	cfg := vmconfig.Config{
		UpperMiB: spec.DiskMB,
		Hostname: hostname(spec.ID),
		Env:      baseEnv(spec),
		Hosts:    fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname(spec.ID)),
		Resolv:   "# no resolver: this sandbox has no network egress\n",
	}
	if cfg.UpperMiB <= 0 {
		cfg.UpperMiB = defaultUpperMiB
	}
	disks := []vmm.Disk{{Path: filepath.Join(dir, configDisk), Serial: vmconfig.DiskSerial}}
	for i, d := range dirs {
		meta, blob := vmconfig.LayerSerials(i)
		cfg.Layers = append(cfg.Layers, vmconfig.Layer{Meta: meta, Blob: blob})
		disks = append(disks,
			vmm.Disk{Path: filepath.Join(d, layerspec.MetaFile), Serial: meta},
			vmm.Disk{Path: filepath.Join(d, layerspec.BlobFile), Serial: blob})
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
		Machine:       vmm.MicroVM,
		Accel:         r.accelerator(),
		CPUs:          vcpus(spec.CPU),
		MemoryMiB:     max(spec.MemoryMB, minMemoryMiB),
		Kernel:        k.VmlinuxPath(),
		Initrd:        initrd,
		Cmdline:       r.cmdline(),
		Disks:         disks,
		Agent:         true,
		RunDir:        dir,
		Binary:        r.opt.QEMU,
		ShutdownGrace: shutdownGrace,
	}
	vm, err := vmm.Start(ctx, vmcfg)
	if err != nil {
		return nil, err
	}
	cu.Add(func() { vm.Kill(context.Background()) })
	if err := writeState(dir, state{Spec: spec, Pid: vm.Pid, VM: vmcfg}); err != nil {
		return nil, err
	}

	var client *agentproto.Client
	tm := Timing{Spawn: vm.Started.Spawn.Sub(t0), QMP: vm.Started.QMP.Sub(t0), Cont: vm.Started.Cont.Sub(t0)}
	err = vm.WaitReady(ctx, func(ctx context.Context) error {
		c, err := dialAgent(ctx, vm.AgentSocket(), r, &tm, t0)
		client = c
		return err
	}, r.opt.BootTimeout)
	if err != nil {
		return nil, err
	}
	cu.Add(func() { client.Close() })
	r.log.Debug("microvm ready", "id", spec.ID, "spawn", tm.Spawn, "qmp", tm.QMP, "cont", tm.Cont, "connected", tm.Connected, "hello", tm.Hello)

	sb := &Sandbox{id: spec.ID, rt: r, spec: spec, dir: dir, vm: vm, client: client, release: release, timing: tm}
	if err := sb.startPhase(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errdefs.New(errdefs.Unavailable, "runtime_closed", "the microvm runtime is closed")
	}
	if _, ok := r.sandboxes[spec.ID]; ok {
		return nil, errdefs.New(errdefs.Conflict, "sandbox_exists", "sandbox %s exists", spec.ID)
	}
	r.sandboxes[spec.ID] = sb
	cu.Release()
	return sb, nil
}

// check refuses what this slice of the tier cannot do.
func (r *Runtime) check(spec sandbox.Spec) error {
	if len(spec.Image.Layers) == 0 {
		return errdefs.New(errdefs.Invalid, "image_without_layers", "the microvm tier runs images built from layers; %s has none", spec.Image.Name)
	}
	if len(spec.Image.Layers) > maxLayers {
		return errdefs.New(errdefs.Invalid, "too_many_layers", "%d layers: the microvm tier takes at most %d", len(spec.Image.Layers), maxLayers)
	}
	if spec.Network != nil && spec.Network.Egress != "" && spec.Network.Egress != "none" || spec.Network != nil && len(spec.Network.Allow) > 0 {
		return sandbox.Unsupported(Tier, "network egress")
	}
	for _, p := range spec.Phases {
		if err := checkPhaseEnforceable(spec, p); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errdefs.New(errdefs.Unavailable, "runtime_closed", "the microvm runtime is closed")
	}
	if _, ok := r.sandboxes[spec.ID]; ok {
		return errdefs.New(errdefs.Conflict, "sandbox_exists", "sandbox %s exists", spec.ID)
	}
	return nil
}

// maxLayers keeps the disks within vmm's 24 (two per layer and the
// config disk).
const maxLayers = 11

// vcpus maps a CPU share to whole vCPUs: at least one, at most the host's.
func vcpus(cpu float64) int {
	n := int(math.Ceil(cpu))
	return min(max(n, 1), runtime.NumCPU())
}

// hostname is a sandbox's host name: its ID, cut to 63 bytes.
func hostname(id string) string {
	if len(id) > 63 {
		return id[:63]
	}
	return id
}

// baseEnv is the guest agent's environment for every command: the usual
// variables, the sandbox's HOSTNAME, then its spec's.
func baseEnv(spec sandbox.Spec) []string {
	env := map[string]string{
		"HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm",
		"PATH":     "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME": hostname(spec.ID),
	}
	maps.Copy(env, spec.Env)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// dialAgent connects to the agent's port and waits for its hello: the
// readiness check of a boot. QEMU accepts the connection at once and
// holds the hello until the guest's agent opens its end of the port.
func dialAgent(ctx context.Context, sock string, r *Runtime, tm *Timing, t0 time.Time) (*agentproto.Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("connecting to the agent: %w", err)
	}
	tm.Connected = time.Since(t0)
	c := agentproto.NewClient(conn, r.log)
	if _, err := c.Hello(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting the agent: %w", err)
	}
	tm.Hello = time.Since(t0)
	return c, nil
}

// Timing is when a Create passed its steps, from its start (after the
// spec's checks): for measurements and debug logs.
type Timing struct {
	Spawn     time.Duration // QEMU's process started
	QMP       time.Duration // its QMP answered
	Cont      time.Duration // the guest was let run
	Connected time.Duration // agent.sock accepted the connection
	Hello     time.Duration // the agent answered hello: ready
}
