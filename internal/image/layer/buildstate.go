package layer

import (
	"context"
	"os"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// BuildState builds a state layer (a sandbox's writable state, a
// snapshot) from the directory src into outDir with the same Go EROFS
// writer and layout as BuildTar (all data in data.blob, each file
// contiguous, identical files once). Unlike BuildDir it keeps overlay
// whiteouts (character devices 0/0) and opaque directories (xattr
// trusted.overlay.opaque=y), so that the layer hides what the layers
// below it hold there when it is mounted among an overlay's lowers, and
// files keep their modification times (build tools compare them). Other
// device nodes, FIFOs and sockets are refused as by BuildDir. Its source
// kind is "state" and its source digest TreeDigest's, whiteouts included.
//
// It is on a fork's path, so it is built in process: mkfs.erofs, which
// hashes every chunk again in its own code, took ~90 ms of a 10 MB
// snapshot. src must not change during the build.
func BuildState(ctx context.Context, src, outDir string) (Artifact, error) {
	if fi, err := os.Lstat(src); err != nil || !fi.IsDir() {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeLayerSourceNotDirectory, "layer source %s is not a directory", src)
	}
	if err := prepareOutDir(outDir); err != nil {
		return Artifact{}, err
	}
	a, err := buildState(ctx, src, outDir)
	if err != nil {
		cleanOutDir(outDir)
		return Artifact{}, err
	}
	return a, nil
}
