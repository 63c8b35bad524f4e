// Package layer builds and describes DSec's image layers. A layer is an
// EROFS artifact in three files: meta.erofs (the metadata image, whose
// chunk indexes point at device 1), data.blob (the file data, in 1 MiB
// chunks) and layer.json (the Manifest). A layer's ID is the SHA-256 of
// its canonical manifest, and builds are reproducible, so the same input
// gives the same ID on any machine.
//
// BuildDir, BuildTar and BuildOCI make artifacts; Validate and Load check
// and read them. They keep no shared state and may run concurrently on
// distinct output directories. RATIONALE.md explains the choices.
package layer

import "github.com/dsec-dev/dsec/internal/image/layerspec"

// File names, media type, chunk size and source kinds; see package
// layerspec, where the manifest types live.
const (
	MetaFile     = layerspec.MetaFile
	BlobFile     = layerspec.BlobFile
	ManifestFile = layerspec.ManifestFile
	ChunksFile   = layerspec.ChunksFile
	MediaType    = layerspec.MediaType
	ChunkSize    = layerspec.ChunkSize
	SourceDir    = layerspec.SourceDir
	SourceTar    = layerspec.SourceTar
	SourceOCI    = layerspec.SourceOCI
	SourceDocker = layerspec.SourceDocker
	SourceState  = layerspec.SourceState
)

// The manifest types (aliases of package layerspec's).
type (
	Manifest = layerspec.Manifest
	FileRef  = layerspec.FileRef
	Source   = layerspec.Source
	Builder  = layerspec.Builder
	File     = layerspec.File
)

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string { return layerspec.Digest(b) }

// ValidDigest reports whether d is "sha256:" and 64 lower-case hex digits.
func ValidDigest(d string) bool { return layerspec.ValidDigest(d) }

// Artifact is a built layer on disk: Dir holds MetaFile, BlobFile and
// ManifestFile.
type Artifact struct {
	Dir      string
	Manifest Manifest
}

// ID is the artifact's layer ID.
func (a Artifact) ID() string { return a.Manifest.ID() }
