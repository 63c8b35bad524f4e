package layer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	a, err := buildDir(ctx, bin, version, root, outDir, false)
	if err != nil {
		cleanOutDir(outDir)
		return Artifact{}, err
	}
	return a, nil
}

// buildDir builds root; state builds a state layer (see BuildState).
func buildDir(ctx context.Context, bin, version, root, outDir string, state bool) (Artifact, error) {
	digest, err := treeDigest(ctx, root, state)
	if err != nil {
		return Artifact{}, err
	}
	// The options that shape the output. Paths do not. A state layer
	// keeps its files' modification times (build tools compare them);
	// its superblock's build time is then fixed after the build, so that
	// the same tree builds to the same bytes.
	times, kind := []string{"-T0"}, SourceDir
	if state {
		times, kind = []string{"--preserve-mtime"}, SourceState
	}
	opts := append(times, "-U"+uuidFromDigest(digest), "--chunksize="+strconv.Itoa(ChunkSize), "--blobdev")
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
	if state {
		if err := fixBuildTime(meta); err != nil {
			return Artifact{}, err
		}
	}
	return finish(ctx, outDir, Source{Kind: kind, Digest: digest},
		Builder{Name: "mkfs.erofs", Version: version, Options: opts})
}

// stateBuildTime is a state layer's build time in its superblock.
// mkfs.erofs writes the time it ran there: a state layer keeps its files'
// own times (--preserve-mtime, whose every inode then carries its own),
// and the superblock's is set to this fixed one after the build.
const stateBuildTime = 4102444800 // 2100-01-01

// fixBuildTime sets meta's superblock build time to stateBuildTime and
// its checksum to match.
func fixBuildTime(meta string) error {
	f, err := os.OpenFile(meta, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1<<maxBlockBits)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("fixing the build time of %s: %w", MetaFile, err)
	}
	b = b[:n]
	s, err := ParseSuperblock(b)
	if err != nil {
		return fmt.Errorf("fixing the build time of %s: %w", MetaFile, err)
	}
	sb := b[erofsSuperOffset:]
	binary.LittleEndian.PutUint64(sb[24:], stateBuildTime)
	binary.LittleEndian.PutUint32(sb[32:], 0) // nanoseconds
	end := erofsSuperOffset + erofsSuperSize
	if s.FeatureCompat&compatSBChecksum != 0 {
		end = s.BlockSize()
		binary.LittleEndian.PutUint32(sb[4:], superblockChecksum(b[:end]))
	}
	if _, err := f.WriteAt(b[erofsSuperOffset:end], erofsSuperOffset); err != nil {
		return fmt.Errorf("fixing the build time of %s: %w", MetaFile, err)
	}
	return f.Sync()
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
