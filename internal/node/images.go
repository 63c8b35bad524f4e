package node

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/builtin"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// resolveImage materialises an image on this node. Today images are host
// directories ("dir:/abs/path") or built-in images this node installed
// ("builtin:name"); the layer store plugs in here.
func (a *Agent) resolveImage(ref noderpc.ImageRef) (sandbox.Image, error) {
	dir, ok := strings.CutPrefix(ref.Source, "dir:")
	if name, isBuiltin := strings.CutPrefix(ref.Source, builtin.SourcePrefix); isBuiltin && a.opt.DataDir != "" {
		dir, ok = builtin.Dir(a.opt.DataDir, name), true
	}
	if !ok {
		return sandbox.Image{}, errdefs.New(errdefs.Unsupported, "image_source_unsupported", "image %s has source %q, which this node cannot load", ref.Name, ref.Source)
	}
	if !filepath.IsAbs(dir) {
		return sandbox.Image{}, errdefs.New(errdefs.Invalid, "invalid_image", "image %s: directory %q is not absolute", ref.Name, dir)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return sandbox.Image{}, errdefs.New(errdefs.NotFound, "image_missing_on_node", "image %s: directory %s is missing on this node", ref.Name, dir)
	}
	return sandbox.Image{ID: ref.ID, Name: ref.Name, Root: dir}, nil
}
