package layer

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// BuildState builds a state layer (a sandbox's writable state, a
// snapshot) from the directory src into outDir, as BuildDir does, with
// two differences: overlay whiteouts in src (character devices 0/0) and
// opaque directories (xattr trusted.overlay.opaque=y) are kept, so that
// the layer hides what the layers below it hold there when it is mounted
// among an overlay's lowers; and files keep their modification times.
// Other device nodes, FIFOs and sockets are refused as by BuildDir. Its
// source kind is "state".
func BuildState(ctx context.Context, src, outDir string) (Artifact, error) {
	bin, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return Artifact{}, fmt.Errorf("building layer: mkfs.erofs: %w: %w", err, errdefs.ErrNotSupported)
	}
	version, err := mkfsVersion(ctx, bin)
	if err != nil {
		return Artifact{}, err
	}
	if fi, err := os.Lstat(src); err != nil || !fi.IsDir() {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeLayerSourceNotDirectory, "layer source %s is not a directory", src)
	}
	if err := prepareOutDir(outDir); err != nil {
		return Artifact{}, err
	}
	a, err := buildDir(ctx, bin, version, src, outDir, true)
	if err != nil {
		cleanOutDir(outDir)
		return Artifact{}, err
	}
	return a, nil
}
