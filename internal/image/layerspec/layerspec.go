// Package layerspec defines the description of a DSec image layer — its
// manifest (layer.json), file references and ID — with no dependencies, so
// that every part of DSec (and the small in-sandbox agent) can speak of
// layers without linking the builders of package layer.
package layerspec

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// File names inside a layer artifact directory.
const (
	MetaFile     = "meta.erofs"
	BlobFile     = "data.blob"
	ManifestFile = "layer.json"
	// ChunksFile is data.blob's chunk index (the digest of every
	// ChunkSize bytes), by which a node loading the blob on demand checks
	// each chunk it fetches.
	ChunksFile = "chunks.json"
)

// MediaType identifies layer manifests.
const MediaType = "application/vnd.dsec.layer.v1+json"

// ChunkSize is the data chunk size of every layer (the lazy-loading unit).
const ChunkSize = 1 << 20

// Source kinds.
const (
	SourceDir    = "dir"
	SourceTar    = "tar"
	SourceOCI    = "oci"    // an OCI image layout
	SourceDocker = "docker" // a `docker save` archive
	// SourceState is a sandbox's writable state (a snapshot): a directory
	// whose whiteouts (character devices 0/0) and opaque directories
	// (xattr trusted.overlay.opaque=y) hide what the layers below hold.
	SourceState = "state"
)

// Manifest is layer.json. Field order is the canonical order: the ID is
// the SHA-256 of json.Marshal(Manifest), which writes fields in this order
// and sorts map keys.
type Manifest struct {
	MediaType string `json:"media_type"`
	Version   int    `json:"version"`
	// Meta and Blob are the two EROFS files.
	Meta FileRef `json:"meta"`
	Blob FileRef `json:"blob"`
	// ChunkSize is the chunk size of data.blob.
	ChunkSize int `json:"chunk_size"`
	// Chunks is data.blob's chunk index (ChunksFile). The layer's ID
	// covers it, and it covers every chunk, so a chunk fetched alone is
	// checked against the ID. Layers built before it existed have none
	// (the zero FileRef, left out of the JSON, so their IDs stay): their
	// blob is fetched whole.
	Chunks FileRef `json:"chunks,omitzero"`
	// Source says what the layer was built from and that input's digest
	// (a canonical tree hash for directories, the archive's or image's
	// digest otherwise).
	Source Source `json:"source"`
	// Builder records the tool and options that made the files.
	Builder Builder `json:"builder"`
}

// FileRef names a file by content.
type FileRef struct {
	Digest string `json:"digest"` // "sha256:<hex>"
	Size   int64  `json:"size"`
}

// File is one content file of a layer artifact: its name in the
// artifact's directory and what it holds.
type File struct {
	Name string
	Ref  FileRef
}

// Files lists the artifact's content files (all but ManifestFile):
// MetaFile, BlobFile and, if the manifest has one, ChunksFile.
func (m Manifest) Files() []File {
	fs := []File{{MetaFile, m.Meta}, {BlobFile, m.Blob}}
	if m.HasChunks() {
		fs = append(fs, File{ChunksFile, m.Chunks})
	}
	return fs
}

// HasChunks reports whether the layer has a chunk index (ChunksFile).
func (m Manifest) HasChunks() bool { return m.Chunks != FileRef{} }

// Source describes a layer's input.
type Source struct {
	Kind   string `json:"kind"`
	Digest string `json:"digest"`
}

// Builder describes how a layer was built.
type Builder struct {
	Name    string   `json:"name"`    // "mkfs.erofs" or "go-erofs"
	Version string   `json:"version"` // e.g. "1.5"
	Options []string `json:"options"` // the options that affect the output
}

// Canonical returns the manifest's canonical encoding.
func (m Manifest) Canonical() []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("encoding a layer manifest: %v", err)) // plain data: cannot fail
	}
	return b
}

// ID is the layer's ID: "sha256:" and the hex SHA-256 of the canonical
// manifest.
func (m Manifest) ID() string { return Digest(m.Canonical()) }

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ValidDigest reports whether d is "sha256:" and 64 lower-case hex digits.
// (No regexp: this package is linked into the in-sandbox agent, whose
// size is its memory.)
func ValidDigest(d string) bool {
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != 64 {
		return false
	}
	for _, c := range hexPart {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Validate checks the manifest's own consistency (not the files).
func (m Manifest) Validate() error {
	switch {
	case m.MediaType != MediaType || m.Version != 1:
		return fmt.Errorf("layer manifest: unknown media type %q version %d", m.MediaType, m.Version)
	case !ValidDigest(m.Meta.Digest) || m.Meta.Size <= 0:
		return fmt.Errorf("layer manifest: bad meta reference %+v", m.Meta)
	case !ValidDigest(m.Blob.Digest) || m.Blob.Size < 0:
		return fmt.Errorf("layer manifest: bad blob reference %+v", m.Blob)
	case m.ChunkSize != ChunkSize:
		return fmt.Errorf("layer manifest: chunk size %d, want %d", m.ChunkSize, ChunkSize)
	case m.HasChunks() && (!ValidDigest(m.Chunks.Digest) || m.Chunks.Size <= 0):
		return fmt.Errorf("layer manifest: bad chunk index reference %+v", m.Chunks)
	case m.Source.Kind == "" || !ValidDigest(m.Source.Digest):
		return fmt.Errorf("layer manifest: bad source %+v", m.Source)
	}
	return nil
}

// Layer is a layer as the parts of DSec pass it around: its ID and its
// manifest, which names its files in the blob store.
type Layer struct {
	ID       string   `json:"id"`
	Manifest Manifest `json:"manifest"`
}
