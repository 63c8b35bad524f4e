package layer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// BuildDir builds a layer from the directory src into outDir (created if
// needed; it must be empty) with Debian's mkfs.erofs (erofs-utils 1.5 or
// later) as a subprocess:
//
//	mkfs.erofs --quiet -T0 -U<uuid> --chunksize=1048576 --blobdev=<outDir>/data.blob <outDir>/meta.erofs <src>
//
// Owners, modes (with setuid, setgid and sticky bits), xattrs, symlinks and
// hard links are kept; times are fixed at 0. The source digest is
// TreeDigest(src) and the UUID is derived from it, so a tree copied
// anywhere builds to the same bytes and LayerID. src must not change during
// the build. Device nodes, FIFOs and sockets are refused (errdefs.Invalid,
// "device_node" / "special_file"). Without mkfs.erofs the error wraps
// errdefs.ErrNotSupported. The artifact is validated before it is returned;
// on error outDir is left without artifact files.
func BuildDir(ctx context.Context, src, outDir string, opt BuildOptions) (Artifact, error) {
	bin, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return Artifact{}, fmt.Errorf("building layer: mkfs.erofs: %w: %w", err, errdefs.ErrNotSupported)
	}
	version, err := mkfsVersion(ctx, bin)
	if err != nil {
		return Artifact{}, err
	}
	root, err := filepath.EvalSymlinks(src)
	if err != nil {
		return Artifact{}, errdefs.Wrap(errdefs.NotFound, api.CodeLayerSourceNotFound, err, "layer source %s not found", src)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeLayerSourceNotDirectory, "layer source %s is not a directory", src)
	}
	if out := resolvePath(outDir); out == root || strings.HasPrefix(out, root+string(filepath.Separator)) {
		return Artifact{}, errdefs.New(errdefs.Invalid, api.CodeLayerOutDir, "output directory %s lies inside the source %s", outDir, src)
	}
	if err := prepareOutDir(outDir); err != nil {
		return Artifact{}, err
	}
	a, err := buildDir(ctx, bin, version, root, outDir)
	if err != nil {
		cleanOutDir(outDir)
		return Artifact{}, err
	}
	return a, nil
}

// buildDir builds root.
func buildDir(ctx context.Context, bin, version, root, outDir string) (Artifact, error) {
	digest, err := treeDigest(ctx, root, false)
	if err != nil {
		return Artifact{}, err
	}
	// The options that shape the output. Paths do not.
	opts := []string{"-T0", "-U" + uuidFromDigest(digest), "--chunksize=" + strconv.Itoa(ChunkSize), "--blobdev"}
	meta, blob := filepath.Join(outDir, MetaFile), filepath.Join(outDir, BlobFile)
	args := append([]string{"--quiet"}, opts[:len(opts)-1]...)
	args = append(args, "--blobdev="+blob, meta, root)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return Artifact{}, ctx.Err()
		}
		return Artifact{}, fmt.Errorf("mkfs.erofs: %w: %s", err, bytes.TrimSpace(lastBytes(out.Bytes(), 2048)))
	}
	if err := normalizeMeta(meta); err != nil {
		return Artifact{}, err
	}
	return finish(ctx, outDir, Source{Kind: SourceDir, Digest: digest},
		Builder{Name: "mkfs.erofs", Version: version, Options: opts}, false)
}

// resolvePath is p made absolute with symlinks resolved as far as it
// exists.
func resolvePath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	rest := ""
	for dir := abs; ; dir = filepath.Dir(dir) {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(r, rest)
		}
		if dir == filepath.Dir(dir) {
			return abs
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}

// normalizeMeta makes the image independent of the order in which the
// source file system lists xattrs (see normalizeXattrs).
func normalizeMeta(meta string) error {
	f, err := os.OpenFile(meta, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := normalizeXattrs(f); err != nil {
		return fmt.Errorf("normalizing %s: %w", MetaFile, err)
	}
	return f.Sync()
}

var (
	mkfsVersionRE = regexp.MustCompile(`mkfs\.erofs(?: \(erofs-utils\))?:? v?([0-9][0-9A-Za-z.+~-]*)`)
	mkfsVersions  sync.Map // binary path → version
)

// mkfsVersion returns the version mkfs.erofs reports in its banner.
// erofs-utils 1.5 has no --version option but prints "mkfs.erofs 1.5"
// before complaining about it; later releases print it for --version.
func mkfsVersion(ctx context.Context, bin string) (string, error) {
	if v, ok := mkfsVersions.Load(bin); ok {
		return v.(string), nil
	}
	out, _ := exec.CommandContext(ctx, bin, "--version").CombinedOutput() // 1.5 exits 1 here
	m := mkfsVersionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("mkfs.erofs printed no version: %q", lastBytes(out, 200))
	}
	mkfsVersions.Store(bin, string(m[1]))
	return string(m[1]), nil
}
