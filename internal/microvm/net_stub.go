package microvm

import (
	"context"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// setNetworkPolicy applies a phase's network policy to sb from the host.
// Until the microvm tier has a network, only "none" is accepted.
//
// TODO(merge): replaced by the network branch's implementation.
func (r *Runtime) setNetworkPolicy(ctx context.Context, sb *Sandbox, p *api.NetworkPolicy) error {
	if p == nil || (p.Egress == "" || p.Egress == api.EgressNone) && len(p.Allow) == 0 {
		return nil
	}
	return sandbox.Unsupported(Tier, "network egress")
}
