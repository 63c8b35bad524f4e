// Package builtin provides the images that come with dsec, so that
// `dsec up` works with nothing else to install or build by hand. They are
// layers (see Specs and Ensure): base/busybox (Debian's busybox-static),
// base/debian-12 (debootstrap minbase from the host's Debian mirror),
// toolkit/dsec-guest (the in-sandbox agent) and toolkit/wasm-tools (the
// function tier's example tools). The dsec binary embeds the compiled
// guest and tools (`make build` puts them in assets/); a binary built
// without them compiles them from the source tree.
//
// InstallFunctionImage still lays wasm-tools out as a plain directory
// for the daemon, until it moves to layers.
package builtin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/wasmtools"
	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
)

//go:embed all:assets
var assets embed.FS

// FunctionImage is the name of the function tier's default image.
const FunctionImage = "wasm-tools"

// SourcePrefix marks image sources that each node resolves to its own
// copy of a built-in image.
const SourcePrefix = "builtin:"

// Dir is where a node installs built-in image name under its data dir.
func Dir(dataDir, name string) string {
	return filepath.Join(dataDir, "images", "builtin", name)
}

// ErrNoTools is returned when the binary carries no function tools and
// none can be built.
var ErrNoTools = errors.New("this dsec binary was built without the function tier's tools: build it with `make build`")

// InstallFunctionImage lays out wasm-tools under Dir(dataDir, …) and
// returns its directory and a digest of its content. Files are rewritten
// only if their content changed, so restarts keep compiled-module caches
// warm. A binary built without the embedded tools (plain `go build`, as in
// tests) builds them from the source tree if it can.
func InstallFunctionImage(ctx context.Context, dataDir string) (dir, digest string, err error) {
	dir = Dir(dataDir, FunctionImage)
	prog, err := assets.ReadFile("assets/dsectools.wasm")
	if errors.Is(err, fs.ErrNotExist) {
		if berr := wasmtools.Build(ctx, dir); berr != nil {
			return "", "", fmt.Errorf("%w (building from source: %v)", ErrNoTools, berr)
		}
		prog, err = os.ReadFile(filepath.Join(dir, "bin", wasmtools.Tools[0]+".wasm"))
	}
	if err != nil {
		return "", "", err
	}
	files := map[string][]byte{}
	for _, name := range wasmtools.Tools {
		files[name] = prog
	}
	for name, src := range tiny.Modules {
		files[name] = tiny.Bytes(src)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", "", err
	}
	h := sha256.New()
	for _, name := range append(append([]string(nil), wasmtools.Tools...), wasmtools.TinyTools...) {
		content := files[name]
		sum := sha256.Sum256(content)
		fmt.Fprintf(h, "%s %x\n", name, sum)
		if err := writeIfChanged(filepath.Join(bin, name+".wasm"), content); err != nil {
			return "", "", err
		}
	}
	return dir, "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func writeIfChanged(path string, content []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, content) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
