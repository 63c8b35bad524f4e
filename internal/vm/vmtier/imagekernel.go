package vmtier

import (
	"context"
	"strings"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/builtin"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/vm/vmkernel"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// stackViewer is the optional part of LayerFiles the vm tier uses to look
// for a kernel in an image: a read-only view of the whole stack. It is an
// extra interface so that LayerFiles stays what every tier needs.
type stackViewer interface {
	View(ctx context.Context, layers []layerspec.Layer) (dir string, release func(), err error)
}

// View implements stackViewer over the layer cache (layercache.Cache.View).
func (c CacheFiles) View(ctx context.Context, layers []layerspec.Layer) (string, func(), error) {
	return c.Cache.View(ctx, layers)
}

// imageKernel is an image's own kernel and the initramfs built over it.
type imageKernel struct {
	found  bool
	kernel vmkernel.Kernel
	initrd string
}

// imageKernels memoises imageKernel by layer stack.
type imageKernels struct {
	mu sync.Mutex // guards following fields
	m  map[string]imageKernel
}

// bootFiles returns the kernel and initramfs a VM of layers boots: on the
// vm tier, the image's own kernel when its layers bring one (a
// /boot/vmlinuz-<release> with /lib/modules/<release>/, see
// vmkernel.FromTree), else the node's (boot).
func (r *Runtime) bootFiles(ctx context.Context, layers []layerspec.Layer) (vmkernel.Kernel, string, error) {
	if r.opt.Machine == vmm.Q35 {
		if v, ok := r.opt.Layers.(stackViewer); ok {
			ik, err := r.imageKernel(ctx, v, layers)
			if err != nil {
				return vmkernel.Kernel{}, "", err
			}
			if ik.found {
				return ik.kernel, ik.initrd, nil
			}
		}
	}
	return r.boot(ctx)
}

// imageKernel looks for the kernel of the stack layers, once per stack.
func (r *Runtime) imageKernel(ctx context.Context, v stackViewer, layers []layerspec.Layer) (imageKernel, error) {
	ids := make([]string, len(layers))
	for i, l := range layers {
		ids[i] = l.ID
	}
	key := strings.Join(ids, ",")
	r.kernels.mu.Lock()
	defer r.kernels.mu.Unlock()
	if ik, ok := r.kernels.m[key]; ok {
		return ik, nil
	}
	dir, release, err := v.View(ctx, layers)
	if err != nil {
		return imageKernel{}, err
	}
	defer release()
	k, found, err := vmkernel.FromTree(ctx, r.opt.CacheDir, dir)
	if err != nil {
		return imageKernel{}, errdefs.Wrap(errdefs.Invalid, api.CodeImageKernelInvalid, err, "the kernel the image brings")
	}
	ik := imageKernel{found: found, kernel: k}
	if found {
		guest := r.opt.Guest
		if guest == nil {
			if guest, err = builtin.GuestBinary(r.opt.Version); err != nil {
				return imageKernel{}, errdefs.Wrap(errdefs.Unavailable, api.CodeGuestKernelUnavailable, err, "getting the guest agent")
			}
		}
		if ik.initrd, err = vmkernel.Initramfs(r.opt.CacheDir, k, guest); err != nil {
			return imageKernel{}, errdefs.Wrap(errdefs.Invalid, api.CodeImageKernelInvalid, err, "building the initramfs of the image's kernel")
		}
		r.log.Info("the image brings its kernel", "release", k.Release, "modules", len(k.Modules))
	}
	if r.kernels.m == nil {
		r.kernels.m = map[string]imageKernel{}
	}
	r.kernels.m[key] = ik
	return ik, nil
}
