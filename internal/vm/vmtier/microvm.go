// Package vmtier is the microvm tier and the vm tier: each sandbox is a
// QEMU microvm (Options.Machine vmm.MicroVM, virtio-mmio) or a q35 PC
// (vmm.Q35: SeaBIOS, ACPI, PCI virtio devices; Runtime.Tier() is VMTier)
// (internal/vm/vmm) booted directly into the guest kernel and initramfs of
// internal/vm/vmkernel, whose init (internal/guest/vminit) assembles the image's
// layers into the guest's root and becomes the agent. The node talks to
// that agent with the same protocol as to a container's
// (internal/guest/agentproto), over a virtio-serial port that QEMU bridges to
// RunDir/agent.sock.
//
// # Create
//
// Create gets the layers' files from the node's layer cache (each layer's
// layerspec.MetaFile and layerspec.BlobFile), writes the VM's
// vmconfig.Config to a small raw disk (config.img, serial
// vmconfig.DiskSerial), and starts QEMU with that disk and every layer's
// two files as read-only raw virtio-blk disks (serials l<i>m and l<i>b),
// the writable upper disk (see Limits), the agent port, and vCPUs and
// memory from the spec. The boot watchdog (vmm.VM.WaitReady) waits for
// the agent's hello on agent.sock; the connection that answered it is
// the sandbox's. Any failure tears down what was built, through a
// cleanup stack: QEMU, the network, its run directory (with the upper
// disk), the layer references.
//
// # Network
//
// A VM whose policy (or a later phase's) lets anything in or out gets a
// network from Options.Network, the container tier's network.Manager:
// the same namespace, address, host-side veth and nftables elements as a
// container, so the deny-set, policies, anti-spoofing and SetPolicy hold
// for VMs unchanged. In that namespace the node creates a tap and passes
// its file to QEMU as fd 3 (QEMU needs no privilege and never joins the
// namespace); tc ingress redirects join the tap and eth0 into a layer-2
// pipe (net_linux.go). The guest's NIC has the sandbox's MAC, the one the
// host's neighbour entry names; vminit configures it from vmconfig.Net.
// A VM that may reach nothing gets no NIC. setNetworkPolicy changes the
// policy host-side. docs/design/network.md, "VM sandboxes", says why.
//
// # Kernels
//
// Both tiers boot the node's guest kernel (vmkernel.Fetch), except that a
// vm-tier image whose layers bring /boot/vmlinuz-<release> and
// /lib/modules/<release>/ boots that kernel (imagekernel.go,
// vmkernel.FromTree), with an initramfs built over its modules.
//
// # Jail
//
// With Options.Jail each QEMU runs as a uid and gid of its own (one per
// VM, from the jail's range; no supplementary groups but /dev/kvm's on
// KVM), in a cgroup of its own (guest memory + an overhead, pids, CPU
// quota = vCPUs; made before QEMU starts, QEMU moved in while the guest
// is still paused), and gets its kernel, initrd and disks as descriptors
// the node opens (vmm.Config.PassFiles). A jailed VM's run directory is
// the node's (state.json, the config and upper disks chowned to QEMU's uid); QEMU
// owns only its subdirectory "q" (sockets, serial log). Destroy and a
// failed create remove the cgroup and free the uid. See jail.go.
//
// # Phases, processes, stats
//
// Phases (phase.go): the host applies a phase's network; the guest's
// agent applies the rest (agentproto.OpPhase: kill every other process,
// read-only root but for the writable paths; user and capabilities are
// passed with each exec, root's capabilities limited by SECBIT_NOROOT).
// The guest is inside the trust boundary (the VM is the isolation), and
// the integrity report names these parts guest-enforced. A phase's
// allowed executables and limits cannot be enforced on a VM and are
// refused. Background processes and PTYs go through the same agent calls
// as the container tier's. Stats mixes the host's measures of QEMU's
// process (HostMemoryBytes, CPUSeconds) with the guest's own view
// (MemoryBytes, MemoryLimitBytes, Processes, and DiskBytes,
// DiskLimitBytes, DiskFull from its statfs of its root).
//
// # Limits
//
// Spec.CPU is rounded up to whole vCPUs (at most the host's), Spec.MemoryMB
// is the guest's memory (at least minMemoryMiB), and Spec.DiskMB (default
// 256 MiB) sizes the writable upper layer. With Options.Upper UpperDisk
// (the default) that layer is a disk of its own (upper.go): a sparse raw
// file upper.img in the run directory, a copy (reflink, else sparse) of
// an empty ext4 file system made once per size by mkfs.ext4 under
// CacheDir/upper, given to QEMU as the writable virtio-blk disk with
// serial vmconfig.UpperSerial (discard=unmap; the guest mounts it with
// discard, so deleted files free the host's blocks). What a sandbox
// writes costs the host's disk, not the guest's memory, and a full disk
// is ENOSPC in the guest (Stats' DiskFull); the file goes with the run
// directory and is never counted against the host's free space: disks
// are sparse and overcommitted. The guest loads ext4 for it (~130 ms of
// a TCG boot, see docs/design/vm.md, "The upper disk"). With
// UpperTmpfs the upper is a tmpfs of Spec.DiskMB in the guest: what is
// written counts against the guest's memory, and filling it can run the
// guest out of memory before the tmpfs is full.
//
// # Recover
//
// Each run directory holds state.json (the spec, QEMU's pid, its
// vmm.Config and its network namespace). Close leaves VMs running;
// Recover re-adopts them through vmm.Adopt, checks the network manager
// adopted their networks, and reconnects to their agents (the guest
// reopens its port when the old connection ends), then sweeps what no
// re-adopted VM owns: QEMU processes whose command line names a run
// directory under StateDir, run directories, and the jail's cgroups
// (sweep.go).
package vmtier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/layercache"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vm/vmkernel"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// Tier is the microvm tier's name, VMTier the vm tier's: one Runtime
// type serves both, by Options.Machine.
const (
	Tier   = "microvm"
	VMTier = "vm"
)

// Defaults of Options.
const (
	DefaultBootTimeout = 60 * time.Second
	// minMemoryMiB is the least memory a guest boots with: the kernel,
	// the agent and (UpperTmpfs) the upper tmpfs's first writes.
	minMemoryMiB = 128
)

// LayerFiles gives layers' files. It exists so that the runtime needs
// only this from the node's layer cache (and tests can hand it any
// files).
type LayerFiles interface {
	// Files returns, bottom first, each layer's metadata image and data
	// blob (a file the node serves on demand, for a layer loaded
	// lazily), kept until release.
	Files(ctx context.Context, layers []layerspec.Layer) (files []layercache.LayerFile, release func(), err error)
}

// Options configure a Runtime.
type Options struct {
	// StateDir holds a run directory per VM (StateDir/<id>: sockets,
	// console log, config disk). Unix socket paths are limited to 107
	// bytes: keep it short.
	StateDir string
	// CacheDir caches the guest kernel and initramfs (vmkernel) and the
	// upper disks' templates (upper/). On StateDir's file system, the
	// disks are reflinks of their template where it has them.
	CacheDir string
	// Layers gives the layers' files.
	Layers LayerFiles
	// Guest is the dsec-guest binary for the initramfs; nil means
	// builtin.GuestBinary(Version).
	Guest []byte
	// Version is the node's version.
	Version string
	// Logger; nil discards.
	Logger *slog.Logger
	// Accel is vmm.AccelTCG or vmm.AccelKVM; empty means TCG.
	Accel string
	// BootTimeout bounds a boot (DefaultBootTimeout if zero).
	BootTimeout time.Duration
	// QEMU is the QEMU binary; empty means qemu-system-x86_64 from PATH.
	QEMU string
	// Network gives VMs their networks: the node's network manager, the
	// container tier's (a *network.Manager or its *network.Shared view).
	// Nil means no network: a spec whose policy lets anything in or out
	// is refused.
	Network networks
	// Machine is vmm.MicroVM (the default: the microvm tier) or vmm.Q35
	// (the vm tier: SeaBIOS, ACPI, PCI virtio devices).
	Machine vmm.Machine
	// Jail runs each QEMU as an unprivileged user in a cgroup of its own;
	// nil runs it as the node's user, in the node's cgroup (tests).
	Jail *Jail
	// Upper is the kind of each VM's writable upper layer: UpperDisk (the
	// default) or UpperTmpfs.
	Upper string
	// Audit, if set, records the node's audit events about the VMs (a VM
	// that ended by itself: liveness.go).
	Audit recorder
}

// Runtime is the microvm tier on one node. It is safe for concurrent use.
type Runtime struct {
	opt   Options
	log   *slog.Logger
	accel atomic.Value // string: UseAccel's, over opt.Accel

	kernels imageKernels // the vm tier's images' own kernels

	bootMu  sync.Mutex // guards following fields
	kernel  vmkernel.Kernel
	initrd  string
	bootErr error

	ends agentsandbox.Ends // sandbox.EndNotifier

	mu        sync.Mutex // guards following fields
	sandboxes map[string]*Sandbox
	uids      map[uint32]string // the Jail's uids in use, by sandbox ID
	closed    bool
}

// New returns a runtime. The guest kernel is fetched by the first Create.
func New(ctx context.Context, opt Options) (*Runtime, error) {
	if opt.StateDir == "" || opt.CacheDir == "" || opt.Layers == nil {
		return nil, errors.New("microvm: StateDir, CacheDir and Layers are required")
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.BootTimeout == 0 {
		opt.BootTimeout = DefaultBootTimeout
	}
	switch opt.Machine {
	case "":
		opt.Machine = vmm.MicroVM
	case vmm.MicroVM, vmm.Q35:
	default:
		return nil, fmt.Errorf("microvm: machine %q is not %q or %q", opt.Machine, vmm.MicroVM, vmm.Q35)
	}
	switch opt.Upper {
	case "", UpperDisk, UpperTmpfs:
	default:
		return nil, fmt.Errorf("microvm: upper %q is not %q or %q", opt.Upper, UpperDisk, UpperTmpfs)
	}
	if err := os.MkdirAll(opt.StateDir, 0o700); err != nil {
		return nil, err
	}
	if opt.Jail != nil {
		// QEMU's user reaches its own directory below (see Jail).
		if err := os.Chmod(opt.StateDir, 0o711); err != nil {
			return nil, err
		}
		if err := searchable(opt.StateDir); err != nil {
			return nil, err
		}
	}
	return &Runtime{opt: opt, log: opt.Logger, sandboxes: map[string]*Sandbox{}, uids: map[uint32]string{}}, nil
}

// Tier implements sandbox.Runtime: Tier, or VMTier for a q35 runtime.
func (r *Runtime) Tier() string {
	if r.opt.Machine == vmm.Q35 {
		return VMTier
	}
	return Tier
}

// Capabilities implements sandbox.Runtime.
func (r *Runtime) Capabilities() sandbox.Capabilities { return agentsandbox.Capabilities() }

// Fingerprint implements sandbox.Runtime.
func (r *Runtime) Fingerprint(ctx context.Context) api.TierInfo {
	info := api.TierInfo{Name: r.Tier(), Available: true, Accelerator: r.accelerator(),
		GuestKernel: true, GuestEnforced: sandbox.GuestPhaseParts()}
	bin := r.opt.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	if _, err := exec.LookPath(bin); err != nil {
		info.Available, info.Reason = false, "QEMU is not installed (Debian qemu-system-x86)"
	} else if _, err := exec.LookPath(mkfsExt4); err != nil && r.upperKind() == UpperDisk {
		info.Available, info.Reason = false, "mkfs.ext4 is not installed (Debian e2fsprogs) for the VMs' upper disks"
	}
	return info
}

// boot returns the guest kernel and initramfs, fetching and building them
// on first use (a failure is retried by the next call).
func (r *Runtime) boot(ctx context.Context) (vmkernel.Kernel, string, error) {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	if r.initrd != "" {
		return r.kernel, r.initrd, nil
	}
	k, err := vmkernel.Fetch(ctx, r.opt.CacheDir, r.log)
	if err != nil {
		return vmkernel.Kernel{}, "", errdefs.Wrap(errdefs.Unavailable, api.CodeGuestKernelUnavailable, err, "fetching the guest kernel")
	}
	guest := r.opt.Guest
	if guest == nil {
		if guest, err = builtin.GuestBinary(r.opt.Version); err != nil {
			return vmkernel.Kernel{}, "", errdefs.Wrap(errdefs.Unavailable, api.CodeGuestKernelUnavailable, err, "getting the guest agent")
		}
	}
	initrd, err := vmkernel.Initramfs(r.opt.CacheDir, k, guest)
	if err != nil {
		return vmkernel.Kernel{}, "", errdefs.Wrap(errdefs.Unavailable, api.CodeGuestKernelUnavailable, err, "building the initramfs")
	}
	r.kernel, r.initrd = k, initrd
	return k, initrd, nil
}

// cmdline is the guest kernel's command line (vmkernel.Cmdline).
func (r *Runtime) cmdline() string {
	return vmkernel.Cmdline(r.accelerator() == vmm.AccelTCG)
}

// Close implements sandbox.Runtime: sandboxes are forgotten, their VMs
// left running for the next Recover.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	sbs := r.sandboxes
	r.sandboxes, r.closed = map[string]*Sandbox{}, true
	r.mu.Unlock()
	for _, sb := range sbs {
		sb.detach()
	}
	return nil
}

// CacheFiles is LayerFiles over the node's layer cache
// (layercache.Cache.Files).
type CacheFiles struct {
	Cache *layercache.Cache
}

// Files implements LayerFiles.
func (c CacheFiles) Files(ctx context.Context, layers []layerspec.Layer) ([]layercache.LayerFile, func(), error) {
	return c.Cache.Files(ctx, layers)
}
