package sandbox

import (
	"slices"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// transitions is the lifecycle state machine: the states each state may
// move to. stopped and failed are final.
var transitions = map[api.State][]api.State{
	api.StatePending:  {api.StateRunning, api.StateStopping, api.StateFailed},
	api.StateRunning:  {api.StateStopping, api.StateFailed},
	api.StateStopping: {api.StateStopped, api.StateFailed},
}

// CheckTransition returns an error of class Conflict unless from → to is
// allowed.
func CheckTransition(from, to api.State) error {
	if slices.Contains(transitions[from], to) {
		return nil
	}
	return errdefs.New(errdefs.Conflict, api.CodeInvalidStateTransition, "sandbox cannot go from %s to %s", from, to)
}

// Final reports whether s is a final state.
func Final(s api.State) bool {
	return s == api.StateStopped || s == api.StateFailed
}

// Live reports whether a sandbox in state s holds resources on a node.
func Live(s api.State) bool {
	return s == api.StatePending || s == api.StateRunning || s == api.StateStopping
}

// ValidState reports whether s names a state.
func ValidState(s api.State) bool {
	switch s {
	case api.StatePending, api.StateRunning, api.StateStopping, api.StateStopped, api.StateFailed:
		return true
	}
	return false
}

// KnownTier reports whether tier is one DSec defines.
func KnownTier(tier string) bool {
	return slices.Contains(api.Tiers, tier)
}

func tierOrder(tier string) int {
	if i := slices.Index(api.Tiers, tier); i >= 0 {
		return i
	}
	return len(api.Tiers)
}
