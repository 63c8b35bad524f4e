package layerspec

import (
	"strings"
	"testing"
)

func testManifest() Manifest {
	d := "sha256:" + strings.Repeat("ab", 32)
	return Manifest{
		MediaType: MediaType, Version: 1,
		Meta: FileRef{Digest: d, Size: 4096}, Blob: FileRef{Digest: d, Size: 1 << 21},
		ChunkSize: ChunkSize, Source: Source{Kind: SourceDir, Digest: d},
	}
}

// A layer without a chunk index encodes as before the field existed (its
// ID is unchanged); one with it lists the index among its files.
func TestManifestChunks(t *testing.T) {
	m := testManifest()
	if strings.Contains(string(m.Canonical()), "chunks") {
		t.Errorf("a manifest without a chunk index encodes one: %s", m.Canonical())
	}
	if m.HasChunks() || len(m.Files()) != 2 {
		t.Errorf("without a chunk index: HasChunks %v, files %v", m.HasChunks(), m.Files())
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	before := m.ID()
	m.Chunks = FileRef{Digest: "sha256:" + strings.Repeat("cd", 32), Size: 100}
	if !strings.Contains(string(m.Canonical()), `"chunks":{"digest":"sha256:cdcd`) || m.ID() == before {
		t.Errorf("the chunk index is not in the manifest's encoding or ID: %s", m.Canonical())
	}
	fs := m.Files()
	if !m.HasChunks() || len(fs) != 3 || fs[2].Name != ChunksFile || fs[2].Ref != m.Chunks {
		t.Errorf("with a chunk index: HasChunks %v, files %v", m.HasChunks(), fs)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []FileRef{{Digest: "sha256:x", Size: 100}, {Digest: m.Chunks.Digest}} {
		m.Chunks = bad
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "chunk index") {
			t.Errorf("chunk index %+v: Validate said %v", bad, err)
		}
	}
}
