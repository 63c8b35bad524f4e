//go:build !linux

package guest

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Init is Linux-only.
func Init(ctx context.Context, argv []string) (int, error) {
	return ExitCannot, fmt.Errorf("dsec-guest init: %w", errdefs.ErrNotSupported)
}

// SetupSandbox is Linux-only.
func SetupSandbox(cfgFile *os.File) (net.Listener, SandboxConfig, error) {
	return nil, SandboxConfig{}, fmt.Errorf("dsec-guest sandbox: %w", errdefs.ErrNotSupported)
}

// Zygote is Linux-only.
func Zygote(conn *os.File) int {
	fmt.Fprintf(os.Stderr, "dsec-guest zygote: %v\n", errdefs.ErrNotSupported)
	return 1
}
