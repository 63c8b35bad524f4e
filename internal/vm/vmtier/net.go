package vmtier

import (
	"context"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/network"
)

// networks gives VMs their networks: the container tier's network
// manager (*network.Manager, or the *network.Shared view of it the daemon
// gives each tier), so that VMs and containers share one address range,
// one nftables table and one deny-set.
type networks interface {
	Acquire(ctx context.Context, id string, p network.Policy) (*network.Endpoint, error)
	SetPolicy(ctx context.Context, id string, p network.Policy) error
	Endpoint(id string) (*network.Endpoint, bool)
	Release(ctx context.Context, id string) error
	// Recover removes the networks of sandboxes not in live.
	Recover(ctx context.Context, live []string) error
}

// setNetworkPolicy applies p to sb's network, host-side (the nftables
// elements of the node's network manager): the guest's next packet is
// judged by it, also on connections opened before. A VM created without
// a NIC (every phase isolated) accepts only isolated policies.
func (r *Runtime) setNetworkPolicy(ctx context.Context, sb *Sandbox, p *api.NetworkPolicy) error {
	policy, err := network.FromAPI(p)
	if err != nil {
		return err
	}
	if sb.netns == "" {
		if policy.Isolated() {
			return nil
		}
		return errdefs.New(errdefs.Internal, api.CodePhaseNetworkUnavailable, "sandbox %s was made without a network", sb.id)
	}
	return r.opt.Network.SetPolicy(ctx, sb.id, policy)
}

// releaseNetwork removes sandbox id's network, if it has one (netns is
// its namespace): the tc redirects plugTap added, then the namespace,
// veth and nftables elements (Manager.Release). QEMU must be gone: its
// tap goes with it. A failure to remove the redirects is logged, not
// returned: the manager's release still removes the namespace (it does
// not pool a namespace with links or qdiscs left).
func (r *Runtime) releaseNetwork(ctx context.Context, id, netns string) error {
	if netns == "" || r.opt.Network == nil {
		return nil
	}
	if err := unplugTap(netns); err != nil {
		r.log.Warn("removing a VM's tap redirects", "id", id, "err", err)
	}
	return r.opt.Network.Release(ctx, id)
}
