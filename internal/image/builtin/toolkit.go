package builtin

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path"
	"slices"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/wasmtools"
	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
)

func guestSpec(buildVersion string) Spec {
	s := Spec{Name: Guest, Role: RoleToolkit, Tiers: containerTiers, recipe: 1}
	bin, err := guestBinary(buildVersion)
	if err != nil {
		s.err = err
		return s
	}
	s.Version = buildVersion + "-" + shortDigest(bin)
	s.Fill = func(ctx context.Context, dir string) error { return fillGuest(dir, bin) }
	return s
}

// fillGuest writes /opt/dsec/bin/dsec-guest (0755, root).
func fillGuest(dir string, bin []byte) error {
	t := tree{dir}
	for _, d := range []string{"opt", "opt/dsec", "opt/dsec/bin"} {
		if err := t.dir(d, 0o755, rootID, rootID); err != nil {
			return err
		}
	}
	return t.file(GuestPath[1:], bin, 0o755)
}

func wasmToolsSpec() Spec {
	s := Spec{Name: WasmTools, Role: RoleToolkit, Tiers: []string{api.TierFunction}, recipe: 1}
	files, err := wasmToolFiles()
	if err != nil {
		s.err = err
		return s
	}
	h := sha256.New()
	for _, name := range sortedKeys(files) {
		fmt.Fprintf(h, "%s %x\n", name, sha256.Sum256(files[name]))
	}
	s.Version = fmt.Sprintf("%x", h.Sum(nil))[:12]
	s.Fill = func(ctx context.Context, dir string) error { return fillFiles(dir, files) }
	return s
}

// wasmToolFiles returns the function tools' tree: bin/<tool>.wasm for every name of wasmtools.Tools (the
// dsectools program) and wasmtools.TinyTools.
func wasmToolFiles() (map[string][]byte, error) {
	prog, err := toolsProgram()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, name := range wasmtools.Tools {
		files[path.Join("bin", name+".wasm")] = prog
	}
	for _, name := range wasmtools.TinyTools {
		src, ok := tiny.Modules[name]
		if !ok {
			return nil, fmt.Errorf("no tiny module %q", name)
		}
		files[path.Join("bin", name+".wasm")] = tiny.Bytes(src)
	}
	return files, nil
}

// fillFiles writes files (0644, root) in name order, with 0755 parents.
func fillFiles(dir string, files map[string][]byte) error {
	t := tree{dir}
	names := sortedKeys(files)
	var dirs []string
	for _, n := range names {
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	for _, d := range slices.Compact(dirs) {
		if err := t.dir(d, 0o755, rootID, rootID); err != nil {
			return err
		}
	}
	for _, n := range names {
		if err := t.file(n, files[n], 0o644); err != nil {
			return err
		}
	}
	return nil
}
