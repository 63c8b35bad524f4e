package vmtier

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// Defaults of Jail.
const (
	// DefaultUIDBase is the first uid (and gid) of QEMU processes: right
	// after the container tier's default range (1000000 + 65536 ids), so
	// the two never share an id.
	DefaultUIDBase = 1065536
	// DefaultUIDCount is how many VMs of one runtime can run at once, each
	// QEMU as its own uid.
	DefaultUIDCount = 65536
	// DefaultOverheadMiB is the memory a QEMU process may use beyond its
	// guest's: its own heap, the device models, and under TCG the
	// translated code cache (QEMU 7.2 sizes it at most 1 GiB, within the
	// touched pages; RSS of an idle 256 MiB guest is ~120 MiB above the
	// guest's touched memory, see bench_linux_test.go).
	DefaultOverheadMiB = 256
	// DefaultPids bounds a QEMU's threads: the main loop, RCU, one per
	// vCPU and a block I/O pool of at most 64 workers.
	DefaultPids = 256
)

// qemuDir is the directory in a jailed VM's run directory that QEMU owns:
// its sockets and the serial log (vmm.Config.RunDir). The run directory
// itself, with state.json, stays the node's.
const qemuDir = "q"

// Jail confines each QEMU process of a Runtime (Options.Jail): it runs as
// a uid and gid of its own (no supplementary groups but /dev/kvm's when
// it uses KVM), in a cgroup of its own with memory, pids and CPU limits,
// and reaches the host's files only through descriptors the node opens
// (vmm.Config.PassFiles), besides its own run directory.
type Jail struct {
	// UIDBase and UIDCount are the ids the runtime gives its QEMUs, one
	// per VM: UIDBase+i as both uid and gid (DefaultUIDBase,
	// DefaultUIDCount when zero). Two runtimes (microvm and vm) need
	// disjoint ranges.
	UIDBase, UIDCount uint32
	// Cgroups makes each VM's group (named by sandbox ID) under a parent
	// of the runtime's own; nil puts QEMU in the node's cgroup.
	Cgroups *cgroups.Manager
	// OverheadMiB is added to the guest's memory for the group's limit
	// (DefaultOverheadMiB when zero).
	OverheadMiB int
	// Pids is the group's pids limit (DefaultPids when zero).
	Pids int64
}

func (j *Jail) uidRange() (base, count uint32) {
	base, count = j.UIDBase, j.UIDCount
	if base == 0 {
		base = DefaultUIDBase
	}
	if count == 0 {
		count = DefaultUIDCount
	}
	return base, count
}

// limits are the cgroup limits of a VM with cpus vCPUs and memMiB of
// guest memory.
func (j *Jail) limits(cpus, memMiB int) cgroups.Limits {
	over, pids := j.OverheadMiB, j.Pids
	if over == 0 {
		over = DefaultOverheadMiB
	}
	if pids == 0 {
		pids = DefaultPids
	}
	return cgroups.Limits{CPU: float64(cpus), MemoryBytes: int64(memMiB+over) << 20, Pids: pids}
}

// allocUID reserves a free uid of the jail's range for sandbox id.
// Preconditions: r.mu must be held.
func (r *Runtime) allocUIDLocked(id string) (uint32, error) {
	base, count := r.opt.Jail.uidRange()
	for i := range count {
		if _, used := r.uids[base+i]; !used {
			r.uids[base+i] = id
			return base + i, nil
		}
	}
	return 0, errdefs.New(errdefs.Unavailable, api.CodeNoVMUID, "all %d QEMU uids of the %s tier are in use", count, r.Tier())
}

// freeUID returns uid to the range if sandbox id holds it.
func (r *Runtime) freeUID(uid uint32, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.uids[uid] == id {
		delete(r.uids, uid)
	}
}

// kvmGroup is the group owning /dev/kvm: QEMU's one supplementary group
// when it uses KVM.
func kvmGroup() ([]uint32, error) {
	fi, err := os.Stat("/dev/kvm")
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Gid == 0 {
		return nil, fmt.Errorf("/dev/kvm belongs to group %d: QEMU's user cannot be given it", st.Gid)
	}
	return []uint32{st.Gid}, nil
}

// jailDirs prepares a jailed VM's run directory dir (the node's, 0711)
// and the part QEMU owns (qemuDir, 0700, uid:uid), and gives it the
// config disk (0400). It returns QEMU's run directory.
func jailDirs(dir, configDisk string, uid uint32) (string, error) {
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	if err := os.Chown(configDisk, int(uid), int(uid)); err != nil {
		return "", err
	}
	if err := os.Chmod(configDisk, 0o400); err != nil {
		return "", err
	}
	q := filepath.Join(dir, qemuDir)
	if err := os.Mkdir(q, 0o700); err != nil {
		return "", err
	}
	return q, os.Chown(q, int(uid), int(uid))
}

// searchable checks that a user other than root can reach dir: every
// directory from / to it has the search bit for others. QEMU, as its
// unprivileged user, creates its sockets below it.
func searchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (mode %v) is not searchable by QEMU's user: give it o+x (it lists nothing; each VM's directory is private)", d, fi.Mode().Perm())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// jailVM applies the jail to vmcfg for sandbox id: a uid, descriptors
// for files, and the cgroup (made now, empty; enter moves QEMU in). The
// returned undo releases what was made, for a failed create.
func (r *Runtime) jailVM(ctx context.Context, id, dir string, vmcfg *vmm.Config) (*cgroups.Group, func(), error) {
	j := r.opt.Jail
	r.mu.Lock()
	uid, err := r.allocUIDLocked(id)
	r.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	free := func() { r.freeUID(uid, id) }
	fail := func(err error) (*cgroups.Group, func(), error) {
		free()
		return nil, nil, err
	}
	u := &vmm.User{UID: uid, GID: uid}
	if vmcfg.Accel == vmm.AccelKVM {
		if u.Groups, err = kvmGroup(); err != nil {
			return fail(err)
		}
	}
	q, err := jailDirs(dir, filepath.Join(dir, configDisk), uid)
	if err != nil {
		return fail(err)
	}
	if w := vmcfg.Writable; w != nil {
		// The upper disk (0600): QEMU opens it writable by its descriptor.
		if err := os.Chown(w.Path, int(uid), int(uid)); err != nil {
			return fail(err)
		}
	}
	vmcfg.User, vmcfg.PassFiles, vmcfg.RunDir = u, true, q
	if j.Cgroups == nil {
		return nil, free, nil
	}
	g, err := j.Cgroups.Create(ctx, id, j.limits(vmcfg.CPUs, vmcfg.MemoryMiB))
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			// A leftover of a VM the sweep did not get to: it has no
			// record, so it is not a live VM's.
			if old, oerr := j.Cgroups.Open(id); oerr == nil {
				if derr := old.Destroy(ctx); derr == nil {
					g, err = j.Cgroups.Create(ctx, id, j.limits(vmcfg.CPUs, vmcfg.MemoryMiB))
				}
			}
		}
		if err != nil {
			return fail(fmt.Errorf("making the cgroup of %s: %w", id, err))
		}
	}
	return g, func() {
		// Kills what is left in it (QEMU, if it got in) and removes it.
		if err := g.Destroy(context.WithoutCancel(ctx)); err != nil {
			r.log.Warn("removing the cgroup of a VM", "id", id, "err", err)
		}
		free()
	}, nil
}

// enterCgroup moves the paused QEMU of vm (all its threads) into its
// group g, then lets the guest run, and returns when it did. QEMU's own
// start-up (before its QMP answered) is charged to the node's group; the
// guest's first instruction, and all its memory, to g.
func enterCgroup(ctx context.Context, g *cgroups.Group, vm *vmm.VM) (time.Time, error) {
	if err := g.AddProc(vm.Pid); err != nil {
		return time.Time{}, err
	}
	if err := vm.Cont(ctx); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// rejail returns the unjail function of a re-adopted VM described by st:
// its cgroup (opened by name) destroyed and its uid freed.
func (r *Runtime) rejail(st state) func() {
	j := r.opt.Jail
	if j == nil || st.VM.User == nil {
		return nil
	}
	id, uid := st.Spec.ID, st.VM.User.UID
	var g *cgroups.Group
	if j.Cgroups != nil {
		var err error
		if g, err = j.Cgroups.Open(id); err != nil {
			r.log.Warn("the cgroup of a recovered VM is gone", "id", id, "err", err)
		}
	}
	return func() {
		if g != nil {
			if err := g.Destroy(context.Background()); err != nil {
				r.log.Warn("removing the cgroup of a VM", "id", id, "err", err)
			}
		}
		r.freeUID(uid, id)
	}
}
