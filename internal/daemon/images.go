package daemon

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"sync"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image"
	"github.com/dsec-dev/dsec/internal/image/builtin"
)

// BuiltinFunctionImage is the function tier's default image.
const BuiltinFunctionImage = "wasm-tools"

// BuiltinContainerImage is the container tier's default image: always
// built (in a fraction of a second), unlike debian-12, which callers name
// when they want a full Debian.
const BuiltinContainerImage = "busybox"

// builtinImage is an image composed of built-in layers.
type builtinImage struct {
	name   string
	layers []wire.ImageLayer // roles and layer names, bottom first
	tiers  []string
}

var containerTiers = []string{wire.TierContainer, wire.TierMicroVM, wire.TierVM}

// builtinImages are registered once all their layers exist.
var builtinImages = []builtinImage{
	{BuiltinFunctionImage, []wire.ImageLayer{{Role: image.RoleToolkit, ID: builtin.WasmTools}}, []string{wire.TierFunction}},
	{"busybox", []wire.ImageLayer{{Role: image.RoleBase, ID: builtin.Busybox}, {Role: image.RoleToolkit, ID: builtin.Guest}}, containerTiers},
	{"debian-12", []wire.ImageLayer{{Role: image.RoleBase, ID: builtin.Debian12}, {Role: image.RoleToolkit, ID: builtin.Guest}}, containerTiers},
}

var versionChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// installBuiltins builds (or finds in the cache) the built-in layers,
// adds them to the registry as name:version (and name:latest), and
// registers the images made of them. Slow layers (debian-12) build in the
// background; their images appear when they are done. Shutdown cancels
// that build and waits until it has ended: its processes killed, its
// temporary tree removed (builtin.Ensure runs debootstrap contained, so
// none of its mounts ever shows in the host's mount table). What a build
// killed with the node (kill -9) left is swept here at the next start.
// The function tools are required: without them `dsec up` has no
// default image.
func (d *daemon) installBuiltins(ctx context.Context, cu *cleanup.Stack, images *image.Registry) error {
	cacheDir := d.cfg.Images.BuiltinCache
	if cacheDir == "" {
		cacheDir = filepath.Join(d.cfg.DataDir, "builtin")
	}
	if err := builtin.Sweep(cacheDir, d.log); err != nil {
		d.log.Warn("sweeping interrupted builds", "err", err)
	}
	var slow []builtin.Spec
	for _, spec := range builtin.Specs(d.build.Version) {
		if spec.Slow {
			if !d.cfg.Images.SkipSlow {
				slow = append(slow, spec)
			}
			continue
		}
		if err := d.installLayer(ctx, cacheDir, spec, images); err != nil {
			if spec.Name == builtin.WasmTools {
				return err
			}
			d.log.Warn("built-in layer unavailable", "layer", spec.Name, "err", err)
		}
	}
	d.registerBuiltinImages(ctx, images)
	if len(slow) == 0 {
		return nil
	}
	// The build stops as soon as shutdown begins (ctx ends); the cleanup
	// waits for it, before the store it registers layers in goes.
	bg, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, spec := range slow {
			d.log.Info("building built-in layer in the background", "layer", spec.Name)
			if err := d.installLayer(bg, cacheDir, spec, images); err != nil {
				if bg.Err() != nil {
					return // shutdown
				}
				d.log.Warn("built-in layer unavailable", "layer", spec.Name, "err", err)
			}
		}
		d.registerBuiltinImages(bg, images)
	}()
	cu.Add(func() { cancel(); wg.Wait() })
	return nil
}

func (d *daemon) installLayer(ctx context.Context, cacheDir string, spec builtin.Spec, images *image.Registry) error {
	a, err := builtin.Ensure(ctx, cacheDir, spec, d.log)
	if err != nil {
		return err
	}
	name := spec.Name + ":" + versionChars.ReplaceAllString(spec.Version, "_")
	_, err = images.AddLayer(ctx, a, name)
	return err
}

// registerBuiltinImages names every built-in image whose layers exist and
// whose name does not already point at the same composition.
func (d *daemon) registerBuiltinImages(ctx context.Context, images *image.Registry) {
	for _, bi := range builtinImages {
		want, err := images.Compose(ctx, bi.layers, bi.tiers)
		if errors.Is(err, errdefs.NotFound) {
			continue // a layer is missing (not built yet, or not buildable here)
		}
		if err != nil {
			d.log.Warn("composing built-in image", "image", bi.name, "err", err)
			continue
		}
		if cur, err := images.Resolve(ctx, bi.name); err == nil && cur.ID == want.ID {
			continue
		}
		if _, err := images.Tag(ctx, want.ID, bi.name); err != nil {
			d.log.Warn("naming built-in image", "image", bi.name, "err", err)
			continue
		}
		d.log.Info("registered built-in image", "image", bi.name, "id", want.ID)
	}
}
