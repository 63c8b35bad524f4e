package builtin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/image/layer"
)

// load checks the cached artifact in dir against spec (its name, recipe
// and, if spec.Version is set, version), its manifest and its files'
// sizes and digests, and returns its stamp. Files that match the digests
// are the bytes layer.BuildDir validated, so fsck need not run again.
// Errors wrap os.ErrNotExist when nothing is cached there.
func load(dir string, spec Spec) (stamp, error) {
	var st stamp
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	if err != nil {
		return stamp{}, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return stamp{}, fmt.Errorf("reading %s: %w", stampFile, err)
	}
	if st.Name != spec.Name || st.Recipe != spec.recipe || spec.Version != "" && st.Version != spec.Version {
		return stamp{}, fmt.Errorf("cached build is %s %s recipe %d, want %s %s recipe %d",
			st.Name, st.Version, st.Recipe, spec.Name, spec.Version, spec.recipe)
	}
	a, err := layer.Load(dir)
	if err != nil {
		return stamp{}, err
	}
	m := a.Manifest
	if m.ID() != st.LayerID {
		return stamp{}, fmt.Errorf("layer ID %s, recorded %s", m.ID(), st.LayerID)
	}
	for _, f := range m.Files() {
		if err := checkFile(filepath.Join(dir, f.Name), f.Ref); err != nil {
			return stamp{}, err
		}
	}
	return st, nil
}

// checkFile checks that the file at p has ref's size and digest.
func checkFile(p string, ref layer.FileRef) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != ref.Size {
		return fmt.Errorf("%s: %d bytes, want %d", p, n, ref.Size)
	}
	if d := "sha256:" + hex.EncodeToString(h.Sum(nil)); d != ref.Digest {
		return fmt.Errorf("%s: digest %s, want %s", p, d, ref.Digest)
	}
	return nil
}

// writeJSON writes v to p, indented.
func writeJSON(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, append(b, '\n'), 0o644)
}
