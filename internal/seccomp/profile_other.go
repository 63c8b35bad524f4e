//go:build !linux

package seccomp

import (
	"fmt"

	moby "github.com/moby/profiles/seccomp"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func dockerDefault() (*moby.Seccomp, error) {
	return nil, fmt.Errorf("the Docker seccomp profile: %w", errdefs.ErrNotSupported)
}
