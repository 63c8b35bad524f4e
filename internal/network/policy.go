package network

import (
	"cmp"
	"context"
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// IP protocol numbers used in set keys.
const (
	ipprotoICMP = 1
	ipprotoTCP  = 6
	ipprotoUDP  = 17
)

// addrRange is an inclusive range of IPv4 addresses.
type addrRange struct{ first, last uint32 }

func prefixRange(p netip.Prefix) addrRange {
	p = p.Masked()
	a := u32(p.Addr())
	return addrRange{a, a | ^uint32(0)>>p.Bits()}
}

func (r addrRange) contains(a uint32) bool { return r.first <= a && a <= r.last }

func u32(a netip.Addr) uint32 {
	b := a.Unmap().As4()
	return binary.BigEndian.Uint32(b[:])
}

func addrOf(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// l4Range allows ports of one protocol on a range of addresses.
type l4Range struct {
	proto uint8
	addr  addrRange
	ports PortRange
}

// zones are the destination classes every policy is checked against.
type zones struct {
	never   []addrRange // denied whatever the policy
	private []addrRange // denied unless an Allow rule names them
}

func (z *zones) isNever(a uint32) bool   { return inRanges(z.never, a) }
func (z *zones) isPrivate(a uint32) bool { return inRanges(z.private, a) }

func inRanges(rs []addrRange, a uint32) bool {
	for _, r := range rs {
		if r.contains(a) {
			return true
		}
	}
	return false
}

// Fixed members of the zones (see the package documentation).
var (
	neverPrefixes = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("224.0.0.0/4"),
		netip.MustParsePrefix("240.0.0.0/4"),
	}
	privatePrefixes = []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("100.64.0.0/10"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("198.18.0.0/15"),
	}
)

// compiled is a Policy with its names resolved and its rules turned into
// disjoint ranges, ready to become set elements.
type compiled struct {
	policy  Policy
	open    bool
	any     []addrRange // all protocols; sorted, disjoint
	l4      []l4Range   // per protocol: disjoint
	inbound []Port      // sorted, unique
	hosts   map[string][]netip.Addr
	dns     []netip.Addr // the resolvers the policy reaches
}

// compile validates p, resolves its names with res and normalises it.
// resolvers are the node's DNS servers: reachable on port 53 under
// ModeOpen. It returns errdefs.Invalid errors for bad policies and names
// that do not resolve.
func compile(ctx context.Context, p Policy, res Resolver, resolvers []netip.Addr, z *zones) (*compiled, error) {
	c := &compiled{policy: p}
	switch p.Mode {
	case "", ModeNone:
		c.policy.Mode = ModeNone
	case ModeAllowlist:
	case ModeOpen:
		c.open = true
	default:
		return nil, invalid("unknown network mode %q", p.Mode)
	}
	if len(p.Allow) > maxRules {
		return nil, invalid("%d allow rules, at most %d", len(p.Allow), maxRules)
	}
	var rects []l4Range
	for _, r := range p.Allow {
		var ranges []addrRange
		switch {
		case r.Host != "" && r.Prefix.IsValid():
			return nil, invalid("allow rule %s: set a prefix or a host, not both", r)
		case r.Host != "":
			addrs, err := res.LookupNetIP(ctx, "ip4", r.Host)
			if err != nil {
				return nil, errdefs.Wrap(errdefs.Invalid, api.CodeNetworkHostUnresolved, err, "resolving allowed host %q", r.Host)
			}
			var v4 []netip.Addr
			for _, a := range addrs {
				if a = a.Unmap(); a.Is4() && !slices.Contains(v4, a) {
					v4 = append(v4, a)
				}
			}
			if len(v4) == 0 {
				return nil, errdefs.New(errdefs.Invalid, api.CodeNetworkHostUnresolved, "allowed host %q has no IPv4 address", r.Host)
			}
			slices.SortFunc(v4, netip.Addr.Compare)
			if len(v4) > maxAddrsPerDNS {
				v4 = v4[:maxAddrsPerDNS]
			}
			if c.hosts == nil {
				c.hosts = map[string][]netip.Addr{}
			}
			c.hosts[r.Host] = v4
			for _, a := range v4 {
				ranges = append(ranges, addrRange{u32(a), u32(a)})
			}
		case r.Prefix.IsValid():
			a, bits := r.Prefix.Addr(), r.Prefix.Bits()
			if a.Is4In6() {
				a, bits = a.Unmap(), bits-96
			}
			if !a.Is4() || bits < 0 {
				return nil, invalid("allow rule %s: only IPv4 is supported", r)
			}
			ranges = append(ranges, prefixRange(netip.PrefixFrom(a, bits)))
		default:
			return nil, invalid("allow rule needs a prefix or a host")
		}
		switch r.Proto {
		case ProtoAny:
			if r.Ports != (PortRange{}) {
				return nil, invalid("allow rule %s: ports need a protocol", r)
			}
			c.any = append(c.any, ranges...)
			continue
		case ProtoTCP, ProtoUDP:
		default:
			return nil, invalid("allow rule %s: unknown protocol %q", r, r.Proto)
		}
		ports := r.Ports
		if ports == (PortRange{}) {
			ports = PortRange{0, 65535}
		}
		if ports.First > ports.Last {
			return nil, invalid("allow rule %s: empty port range", r)
		}
		for _, a := range ranges {
			rects = append(rects, l4Range{protoNum(r.Proto), a, ports})
		}
	}
	for _, in := range p.Inbound {
		if in.Proto != ProtoTCP && in.Proto != ProtoUDP {
			return nil, invalid("inbound port %s: protocol must be tcp or udp", in)
		}
		if in.Port == 0 {
			return nil, invalid("inbound port %s: port 0", in)
		}
		if !slices.Contains(c.inbound, in) {
			c.inbound = append(c.inbound, in)
		}
	}
	slices.SortFunc(c.inbound, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
	})
	if c.policy.Mode == ModeNone {
		// Allow rules wait for a later mode; only inbound ports apply.
		c.any, rects = nil, nil
	}
	if c.open {
		for _, r := range resolvers {
			if a := u32(r); !z.isNever(a) {
				for _, proto := range []uint8{ipprotoUDP, ipprotoTCP} {
					rects = append(rects, l4Range{proto, addrRange{a, a}, PortRange{53, 53}})
				}
			}
		}
	}
	c.any = mergeRanges(c.any)
	c.l4 = disjointL4(rects)
	for _, r := range resolvers {
		if c.reaches(z, u32(r), ipprotoUDP, 53) {
			c.dns = append(c.dns, r)
		}
	}
	return c, nil
}

// reaches reports whether the policy lets a packet to addr, proto, port
// through, in the order the egress chain checks.
func (c *compiled) reaches(z *zones, addr uint32, proto uint8, port uint16) bool {
	if z.isNever(addr) {
		return false
	}
	if inRanges(c.any, addr) {
		return true
	}
	for _, r := range c.l4 {
		if r.proto == proto && r.addr.contains(addr) && r.ports.First <= port && port <= r.ports.Last {
			return true
		}
	}
	return c.open && !z.isPrivate(addr)
}

func protoNum(p Proto) uint8 {
	if p == ProtoUDP {
		return ipprotoUDP
	}
	return ipprotoTCP
}

// mergeRanges sorts rs and merges overlapping and adjacent ranges.
func mergeRanges(rs []addrRange) []addrRange {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b addrRange) int { return cmp.Compare(a.first, b.first) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if uint64(r.first) <= uint64(last.last)+1 {
			last.last = max(last.last, r.last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// disjointL4 turns rectangles (address range × port range, per protocol)
// into disjoint ones covering the same points: nftables' concatenated
// range sets refuse elements whose ends fall inside another element.
func disjointL4(rects []l4Range) []l4Range {
	var out []l4Range
	for _, proto := range []uint8{ipprotoTCP, ipprotoUDP} {
		var bounds []uint32
		for _, r := range rects {
			if r.proto == proto {
				bounds = append(bounds, uint32(r.ports.First), uint32(r.ports.Last)+1)
			}
		}
		slices.Sort(bounds)
		bounds = slices.Compact(bounds)
		var prev []addrRange
		var prevPorts PortRange
		flush := func() {
			for _, a := range prev {
				out = append(out, l4Range{proto, a, prevPorts})
			}
		}
		for i := 0; i+1 < len(bounds); i++ {
			ports := PortRange{uint16(bounds[i]), uint16(bounds[i+1] - 1)}
			var cover []addrRange
			for _, r := range rects {
				if r.proto == proto && r.ports.First <= ports.First && ports.Last <= r.ports.Last {
					cover = append(cover, r.addr)
				}
			}
			cover = mergeRanges(cover)
			if prev != nil && slices.Equal(prev, cover) && uint32(prevPorts.Last)+1 == uint32(ports.First) {
				prevPorts.Last = ports.Last
				continue
			}
			flush()
			prev, prevPorts = cover, ports
		}
		flush()
	}
	return out
}
