// Package wasmtools builds the function tier's default image: the
// dsectools multi-call program (tools/wasm/dsectools) compiled for
// GOOS=wasip1 GOARCH=wasm and installed under every tool name, plus the
// hand-written modules of package tiny.
package wasmtools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/dsec-dev/dsec/internal/wasmtools/tiny"
)

// Tools lists the names dsectools is installed under (bin/<name>.wasm).
var Tools = []string{
	"echo", "cat", "wc", "calc", "json", "env", "exit", "sleep", "yes",
	"ls", "write", "sha256sum", "alloc",
}

// TinyTools lists the names the hand-written modules are installed under.
var TinyTools = []string{"tiny-echo", "trap", "loop"}

const pkgPath = "github.com/dsec-dev/dsec/tools/wasm/dsectools"

// buildFlags are the go build flags of dsectools (part of ForTest's key).
var buildFlags = []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w"}

// Build compiles dsectools with the Go toolchain and lays out an image
// under outDir: outDir/bin/<tool>.wasm for every name in Tools and
// TinyTools. Existing files are replaced. It needs the DSec source tree,
// found from this package's source location or else the current directory.
func Build(ctx context.Context, outDir string) error {
	src, err := ModuleRoot(ctx)
	if err != nil {
		return err
	}
	bin := filepath.Join(outDir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(bin, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	prog := filepath.Join(tmp, "dsectools.wasm")
	args := append(append([]string{"build"}, buildFlags...), "-o", prog, pkgPath)
	cmd := exec.CommandContext(ctx, GoBinary(), args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkgPath, err, out)
	}
	for _, name := range Tools {
		if err := install(prog, filepath.Join(bin, name+".wasm")); err != nil {
			return err
		}
	}
	for name, source := range tiny.Modules {
		f := filepath.Join(tmp, name+".wasm")
		if err := os.WriteFile(f, tiny.Bytes(source), 0o644); err != nil {
			return err
		}
		if err := install(f, filepath.Join(bin, name+".wasm")); err != nil {
			return err
		}
	}
	return nil
}

// install puts a copy of src at dst atomically (a hard link when it can).
func install(src, dst string) error {
	tmp := dst + ".tmp"
	os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("installing %s: %w", dst, err)
	}
	return nil
}

// GoBinary is the go command of the toolchain this binary was built with,
// else the one on PATH.
func GoBinary() string {
	exe := "go"
	if runtime.GOOS == "windows" {
		exe += ".exe"
	}
	if p := filepath.Join(runtime.GOROOT(), "bin", exe); fileExists(p) {
		return p
	}
	return exe // from PATH
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ModuleRoot finds the DSec source tree: two levels above this file when
// built from source, else the main module of the current directory.
func ModuleRoot(ctx context.Context) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Join(filepath.Dir(file), "..", "..")
		if isDSec(root) {
			return root, nil
		}
	}
	out, err := exec.CommandContext(ctx, GoBinary(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("locating the DSec source tree: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	if !isDSec(root) {
		return "", errors.New("locating the DSec source tree: run from inside the DSec module")
	}
	return root, nil
}

func isDSec(root string) bool {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	return err == nil && bytes.HasPrefix(b, []byte("module github.com/dsec-dev/dsec\n"))
}
