//go:build !linux

package sys

import (
	"fmt"
	"os"
	"os/exec"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func EnterSmallMountNS(string, []Bind) error { return errdefs.ErrNotSupported }

func InMountNS(*os.File, func() error) error { return errdefs.ErrNotSupported }

func SetHostnameIn(*os.File, string) error { return errdefs.ErrNotSupported }

func NewUserns(hostUID, hostGID, count int) (int, error) {
	return -1, fmt.Errorf("user namespaces: %w", errdefs.ErrNotSupported)
}

// RunContained needs Linux namespaces.
func RunContained(cmd *exec.Cmd) error {
	return fmt.Errorf("running %s contained: %w", cmd.Path, errdefs.ErrNotSupported)
}

func UserNSOwner(int) (int, error) { return 0, errdefs.ErrNotSupported }
