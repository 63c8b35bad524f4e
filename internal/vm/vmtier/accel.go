package vmtier

import (
	"context"

	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// Prepare fetches the guest kernel and builds the initramfs now instead of
// at the first Create, and returns the kernel's path (for
// vmm.ProbeAccel). A node calls it in the background after it starts.
func (r *Runtime) Prepare(ctx context.Context) (kernel string, err error) {
	k, _, err := r.boot(ctx)
	if err != nil {
		return "", err
	}
	return k.VmlinuxPath(), nil
}

// UseAccel sets the accelerator (vmm.AccelKVM or vmm.AccelTCG) of the VMs
// created from now on, and the one Fingerprint reports: a node's probe of
// KVM (vmm.ProbeAccel) needs the guest kernel, so it may answer after the
// runtime was built with Options.Accel.
func (r *Runtime) UseAccel(accel string) { r.accel.Store(accel) }

// accelerator is the accelerator of new VMs.
func (r *Runtime) accelerator() string {
	if a, ok := r.accel.Load().(string); ok && a != "" {
		return a
	}
	if r.opt.Accel != "" {
		return r.opt.Accel
	}
	return vmm.AccelTCG
}
