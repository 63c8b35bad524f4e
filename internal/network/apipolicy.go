package network

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// FromAPI converts a request's network policy (nil: no egress) and checks
// its syntax; what the rules may reach is checked by Acquire and
// SetPolicy.
func FromAPI(p *api.NetworkPolicy) (Policy, error) {
	if p == nil {
		return Policy{Mode: ModeNone}, nil
	}
	var out Policy
	switch p.Egress {
	case "", api.EgressNone:
		out.Mode = ModeNone
	case api.EgressAllowlist:
		out.Mode = ModeAllowlist
	case api.EgressOpen:
		out.Mode = ModeOpen
	default:
		return Policy{}, invalid("egress must be none, allowlist or open, not %q", p.Egress)
	}
	if len(p.Allow) > maxRules {
		return Policy{}, invalid("at most %d allow rules", maxRules)
	}
	for i, r := range p.Allow {
		rule, err := ruleFromAPI(r)
		if err != nil {
			return Policy{}, invalid("allow[%d]: %s", i, err.Error())
		}
		out.Allow = append(out.Allow, rule)
	}
	return out, nil
}

// Initial returns the policy a sandbox starts with (policy, or with
// phases the first phase's) and whether it needs a network of the node's:
// a policy that is not isolated now or in any later phase (a namespace
// or NIC cannot be added under a running sandbox). Both the container and
// the VM tiers decide by it.
func Initial(policy *api.NetworkPolicy, phases []api.Phase) (Policy, bool, error) {
	if len(phases) == 0 {
		p, err := FromAPI(policy)
		return p, err == nil && !p.Isolated(), err
	}
	first, err := FromAPI(phases[0].Network)
	if err != nil {
		return first, false, err
	}
	for _, ph := range phases {
		p, err := FromAPI(ph.Network)
		if err != nil {
			return first, false, err
		}
		if !p.Isolated() {
			return first, true, nil
		}
	}
	return first, false, nil
}

type ruleError string

func (e ruleError) Error() string { return string(e) }

func ruleFromAPI(r api.NetworkRule) (Rule, error) {
	var out Rule
	switch {
	case (r.CIDR == "") == (r.Host == ""):
		return out, ruleError("name exactly one of cidr and host")
	case r.CIDR != "":
		p, err := netip.ParsePrefix(r.CIDR)
		if err != nil {
			a, aerr := netip.ParseAddr(r.CIDR)
			if aerr != nil {
				return out, ruleError("bad cidr " + strconv.Quote(r.CIDR))
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.Addr().Is4() {
			return out, ruleError("only IPv4 destinations are supported (sandboxes have no IPv6)")
		}
		out.Prefix = p.Masked()
	default:
		out.Host = r.Host
	}
	switch Proto(r.Proto) {
	case ProtoAny, ProtoTCP, ProtoUDP:
		out.Proto = Proto(r.Proto)
	default:
		return out, ruleError("proto must be tcp or udp, not " + strconv.Quote(r.Proto))
	}
	if r.Ports == "" {
		return out, nil
	}
	if out.Proto == ProtoAny {
		return out, ruleError("ports need a proto")
	}
	first, last, ok := strings.Cut(r.Ports, "-")
	if !ok {
		last = first
	}
	a, err1 := strconv.ParseUint(first, 10, 16)
	b, err2 := strconv.ParseUint(last, 10, 16)
	if err1 != nil || err2 != nil || a == 0 || b < a {
		return out, ruleError("bad ports " + strconv.Quote(r.Ports) + " (443 or 8000-8100)")
	}
	out.Ports = PortRange{First: uint16(a), Last: uint16(b)}
	return out, nil
}
