package sandbox

import (
	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Unsupported returns the error for an operation a tier cannot perform. It
// names both, so that users see which switch of tier would help.
func Unsupported(tier, op string) error {
	return errdefs.New(errdefs.Unsupported, api.CodeUnsupportedOnTier, "%s is not supported on the %s tier", op, tier)
}

// ErrGone is returned by a sandbox's methods after Destroy.
func ErrGone(id string) error {
	return errdefs.New(errdefs.NotFound, api.CodeSandboxNotFound, "sandbox %s does not exist on this node", id)
}
