package layer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
)

// Load reads the artifact in dir from its layer.json. It checks the
// manifest's own consistency, not the files; see Validate.
func Load(dir string) (Artifact, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return Artifact{}, errdefs.Wrap(errdefs.NotFound, api.CodeLayerNotFound, err, "no layer manifest in %s", dir)
	}
	if err != nil {
		return Artifact{}, fmt.Errorf("reading layer manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Artifact{}, errdefs.Wrap(errdefs.Invalid, api.CodeLayerManifest, err, "layer manifest in %s is not valid JSON", dir)
	}
	if err := m.Validate(); err != nil {
		return Artifact{}, errdefs.Wrap(errdefs.Invalid, api.CodeLayerManifest, err, "layer manifest in %s is invalid", dir)
	}
	return Artifact{Dir: dir, Manifest: m}, nil
}

// prepareOutDir creates outDir if needed and fails if it holds anything.
func prepareOutDir(outDir string) error {
	if outDir == "" {
		return errdefs.New(errdefs.Invalid, api.CodeLayerOutDir, "no output directory given")
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("creating layer directory: %w", err)
	}
	f, err := os.Open(outDir)
	if err != nil {
		return fmt.Errorf("opening layer directory: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("reading layer directory: %w", err)
	}
	if len(names) > 0 {
		return errdefs.New(errdefs.Conflict, api.CodeLayerOutDirNotEmpty, "output directory %s is not empty", outDir)
	}
	return nil
}

// cleanOutDir removes what a failed build left in outDir (only the
// artifact's own files, never anything else).
func cleanOutDir(outDir string) {
	for _, n := range []string{MetaFile, BlobFile, ChunksFile, ManifestFile} {
		_ = os.Remove(filepath.Join(outDir, n)) // best effort: the build already failed
	}
}

// hashFile returns the file's size and "sha256:<hex>".
func hashFile(path string) (FileRef, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileRef{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return FileRef{}, fmt.Errorf("hashing %s: %w", path, err)
	}
	return FileRef{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// finish hashes the built files, writes layer.json and validates the
// artifact. With scratch its small files are not synced (see
// buildTree).
func finish(ctx context.Context, outDir string, src Source, b Builder, scratch bool) (Artifact, error) {
	meta, err := hashFile(filepath.Join(outDir, MetaFile))
	if err != nil {
		return Artifact{}, err
	}
	idx, err := indexBlob(filepath.Join(outDir, BlobFile))
	if err != nil {
		return Artifact{}, err
	}
	js, err := json.Marshal(idx)
	if err != nil {
		return Artifact{}, fmt.Errorf("encoding the chunk index: %w", err)
	}
	if err := writeFile(filepath.Join(outDir, ChunksFile), js, !scratch); err != nil {
		return Artifact{}, err
	}
	m := Manifest{
		MediaType: MediaType,
		Version:   1,
		Meta:      meta,
		Blob:      FileRef{Digest: idx.Digest, Size: idx.Size},
		ChunkSize: ChunkSize,
		Chunks:    FileRef{Digest: Digest(js), Size: int64(len(js))},
		Source:    src,
		Builder:   b,
	}
	if err := m.Validate(); err != nil {
		return Artifact{}, fmt.Errorf("built layer: %w", err)
	}
	if err := writeFile(filepath.Join(outDir, ManifestFile), m.Canonical(), !scratch); err != nil {
		return Artifact{}, err
	}
	// Its files were hashed just now, above: the image is what is left
	// to check.
	a := Artifact{Dir: outDir, Manifest: m}
	if _, err := checkImage(ctx, a); err != nil {
		return Artifact{}, err
	}
	return a, nil
}

// indexBlob returns the chunk index of the blob at path (which also
// gives its digest and size).
func indexBlob(path string) (chunks.Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return chunks.Index{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return chunks.Index{}, err
	}
	idx, err := chunks.Build(f, st.Size(), ChunkSize)
	if err != nil {
		return chunks.Index{}, fmt.Errorf("indexing %s: %w", path, err)
	}
	return idx, nil
}

// writeFile creates path with b, synced if sync.
func writeFile(path string, b []byte, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// uuidFromDigest formats the first 16 bytes of a "sha256:<hex>" digest
// as a UUID string.
func uuidFromDigest(d string) string {
	h := d[len("sha256:"):]
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
