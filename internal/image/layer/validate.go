package layer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
)

// Check is what Validate checked, for callers that log.
type Check struct {
	// Fsck is "passed", or "skipped: <reason>" when fsck.erofs could not
	// be run (it is not installed).
	Fsck string
}

// Validate checks an artifact on disk: its manifest is consistent, the
// files' digests and sizes match it, meta.erofs has an EROFS superblock
// with exactly one extra device, and fsck.erofs (when installed) accepts
// the image with data.blob as that device. Corruption is reported as an
// errdefs.Invalid error with code "layer_digest_mismatch",
// "layer_bad_superblock", "layer_devices" or "layer_fsck".
func Validate(ctx context.Context, a Artifact) error {
	_, err := CheckArtifact(ctx, a)
	return err
}

// CheckArtifact is Validate that also says which optional steps ran.
func CheckArtifact(ctx context.Context, a Artifact) (Check, error) {
	var c Check
	if err := a.Manifest.Validate(); err != nil {
		return c, errdefs.Wrap(errdefs.Invalid, api.CodeLayerManifest, err, "layer manifest is invalid")
	}
	for _, f := range a.Manifest.Files() {
		if f.Name == BlobFile && a.Manifest.HasChunks() {
			continue // checkChunks reads it once for both
		}
		got, err := hashFile(filepath.Join(a.Dir, f.Name))
		if err != nil {
			return c, fmt.Errorf("validating layer: %w", err)
		}
		if got != f.Ref {
			return c, errdefs.New(errdefs.Invalid, api.CodeLayerDigestMismatch,
				"%s is %s (%d bytes), the manifest says %s (%d bytes)",
				f.Name, got.Digest, got.Size, f.Ref.Digest, f.Ref.Size)
		}
	}
	if err := checkChunks(a); err != nil {
		return c, err
	}
	return checkImage(ctx, a)
}

// checkImage is CheckArtifact without the files' digests: the superblock
// and fsck.erofs. A build that has just hashed its output checks only
// this (reading the blob again cost a 10 MB snapshot ~25 ms).
func checkImage(ctx context.Context, a Artifact) (Check, error) {
	var c Check
	meta, blob := filepath.Join(a.Dir, MetaFile), filepath.Join(a.Dir, BlobFile)
	if err := checkSuperblock(meta); err != nil {
		return c, err
	}
	if err := ctx.Err(); err != nil {
		return c, err
	}
	fsck, err := exec.LookPath("fsck.erofs")
	if err != nil {
		c.Fsck = "skipped: fsck.erofs not found"
		return c, nil
	}
	cmd := exec.CommandContext(ctx, fsck, "--device="+blob, meta)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return c, ctx.Err()
		}
		return c, errdefs.Wrap(errdefs.Invalid, api.CodeLayerFsck, fmt.Errorf("%w: %s", err, bytes.TrimSpace(lastBytes(out.Bytes(), 2048))),
			"fsck.erofs rejects the layer")
	}
	c.Fsck = "passed"
	return c, nil
}

// checkSuperblock requires an EROFS superblock with exactly one extra
// device (data.blob).
func checkSuperblock(meta string) error {
	f, err := os.Open(meta)
	if err != nil {
		return fmt.Errorf("validating layer: %w", err)
	}
	defer f.Close()
	// The superblock, its block and the device table fit in 64 KiB (the
	// largest block size).
	b := make([]byte, 1<<maxBlockBits)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return errdefs.Wrap(errdefs.Invalid, api.CodeLayerBadSuperblock, err, "cannot read the superblock of %s", MetaFile)
	}
	sb, err := ParseSuperblock(b[:n])
	if err != nil {
		return errdefs.Wrap(errdefs.Invalid, api.CodeLayerBadSuperblock, err, "%s has no valid EROFS superblock", MetaFile)
	}
	if sb.ExtraDevices != 1 {
		return errdefs.New(errdefs.Invalid, api.CodeLayerDevices, "%s has %d extra devices, want exactly 1 (%s)", MetaFile, sb.ExtraDevices, BlobFile)
	}
	return nil
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// checkChunks checks that the artifact's chunk index (if it has one)
// is data.blob's: a node loading the blob on demand trusts it for every
// chunk. (Its digest was checked with the other files.)
func checkChunks(a Artifact) error {
	if !a.Manifest.HasChunks() {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(a.Dir, ChunksFile))
	if err != nil {
		return fmt.Errorf("validating layer: %w", err)
	}
	got, err := chunks.Parse(b)
	if err != nil {
		return errdefs.Wrap(errdefs.Invalid, api.CodeLayerChunks, err, "%s is not a chunk index", ChunksFile)
	}
	want, err := indexBlob(filepath.Join(a.Dir, BlobFile))
	if err != nil {
		return fmt.Errorf("validating layer: %w", err)
	}
	if m := a.Manifest.Blob; want.Digest != m.Digest || want.Size != m.Size {
		return errdefs.New(errdefs.Invalid, api.CodeLayerDigestMismatch,
			"%s is %s (%d bytes), the manifest says %s (%d bytes)", BlobFile, want.Digest, want.Size, m.Digest, m.Size)
	}
	if !got.Equal(want) {
		return errdefs.New(errdefs.Invalid, api.CodeLayerChunks, "%s does not index %s (%s)", ChunksFile, BlobFile, a.Manifest.Blob.Digest)
	}
	return nil
}
