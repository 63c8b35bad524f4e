package builtin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/dsec-dev/dsec/internal/wasmtools"
)

// Assets that `make build` compiles into assets/ for the binary to embed.
const (
	guestAsset = "assets/dsec-guest"
	toolsAsset = "assets/dsectools.wasm"
)

// built caches, per process, the programs compiled from source when the
// binary carries no assets (tests). Keyed by what was built.
var built struct {
	mu   sync.Mutex // guards following fields
	prog map[string]builtProg
}

type builtProg struct {
	b   []byte
	err error
}

// asset returns the embedded asset name, or else the result of compile,
// run once per process for key.
func asset(name, key string, compile func(ctx context.Context, tmp string) ([]byte, error)) ([]byte, error) {
	b, err := assets.ReadFile(name)
	if !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if p, ok := built.prog[key]; ok {
		return p.b, p.err
	}
	tmp, err := os.MkdirTemp("", "dsec-builtin-")
	if err == nil {
		b, err = compile(context.Background(), tmp)
		os.RemoveAll(tmp)
	}
	if built.prog == nil {
		built.prog = map[string]builtProg{}
	}
	built.prog[key] = builtProg{b, err}
	return b, err
}

// guestBinary returns dsec-guest: the embedded one, or else compiled from
// the source tree with version buildVersion.
func guestBinary(buildVersion string) ([]byte, error) {
	return asset(guestAsset, "guest "+buildVersion, func(ctx context.Context, tmp string) ([]byte, error) {
		root, err := wasmtools.ModuleRoot(ctx)
		if err != nil {
			return nil, fmt.Errorf("this binary carries no built-in assets (build it with `make build`): %w", err)
		}
		out := filepath.Join(tmp, "dsec-guest")
		cmd := exec.CommandContext(ctx, wasmtools.GoBinary(), "build", "-trimpath", "-buildvcs=false",
			"-ldflags=-s -w -X main.version="+buildVersion, "-o", out, "./cmd/dsec-guest")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building dsec-guest from source: %w\n%s", err, b)
		}
		return os.ReadFile(out)
	})
}

// toolsProgram returns the dsectools WebAssembly program: the embedded
// one, or else compiled from the source tree.
func toolsProgram() ([]byte, error) {
	return asset(toolsAsset, "dsectools", func(ctx context.Context, tmp string) ([]byte, error) {
		if err := wasmtools.Build(ctx, tmp); err != nil {
			return nil, fmt.Errorf("building the wasm tools from source: %w", err)
		}
		return os.ReadFile(filepath.Join(tmp, "bin", wasmtools.Tools[0]+".wasm"))
	})
}

// shortDigest is the first 12 hex digits of b's SHA-256.
func shortDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:12]
}
