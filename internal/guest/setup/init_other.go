//go:build !linux

package setup

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Init is Linux-only.
func Init(ctx context.Context, argv []string) (int, error) {
	return ExitCannot, fmt.Errorf("dsec-guest init: %w", errdefs.ErrNotSupported)
}

// SetupSandbox is Linux-only.
func SetupSandbox(cfgFile *os.File, first *net.UnixConn) (net.Listener, SandboxConfig, error) {
	return nil, SandboxConfig{}, fmt.Errorf("dsec-guest sandbox: %w", errdefs.ErrNotSupported)
}

// Zygote is Linux-only.
func Zygote(conn *os.File) int {
	fmt.Fprintf(os.Stderr, "dsec-guest zygote: %v\n", errdefs.ErrNotSupported)
	return 1
}

// SandboxCommand is Linux-only: the command it returns fails to start.
func SandboxCommand(req ZygoteRequest, console *os.File, extra []*os.File) *exec.Cmd {
	return &exec.Cmd{Err: fmt.Errorf("dsec-guest sandbox: %w", errdefs.ErrNotSupported)}
}

// StartSandbox is Linux-only.
func StartSandbox(cmd *exec.Cmd, req ZygoteRequest) error {
	return fmt.Errorf("dsec-guest sandbox: %w", errdefs.ErrNotSupported)
}

// CommandPidfd is Linux-only: there is none.
func CommandPidfd(cmd *exec.Cmd) *sys.Pidfd { return nil }
