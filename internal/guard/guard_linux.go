//go:build linux && amd64

package guard

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Guard is the programs attached to one cgroup2 directory.
type Guard struct {
	objs  guardObjects
	links []link.Link
}

// DefaultDeny are the destinations no sandbox reaches: link-local (the
// cloud metadata services among them) and AWS's IPv6 metadata address.
var DefaultDeny = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

// Attach loads the programs, refuses deny but for the IPv4 resolvers dns
// on port 53, and attaches them to the cgroup2 directory dir (its
// descendants inherit them). It fails with an error wrapping
// errdefs.ErrNotSupported where cgroup-bpf cannot load.
func Attach(dir string, deny []netip.Prefix, dns []netip.Addr) (*Guard, error) {
	_ = rlimit.RemoveMemlock()
	g := &Guard{}
	if err := loadGuardObjects(&g.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the cgroup-bpf guard: %w (%w)", err, errdefs.ErrNotSupported)
	}
	for _, p := range deny {
		p = p.Masked()
		if p.Addr().Is4() {
			a := p.Addr().As4()
			k := guardKey4{Prefixlen: uint32(p.Bits()), Addr: binary.NativeEndian.Uint32(a[:])}
			if err := g.objs.Deny4.Put(k, uint8(1)); err != nil {
				g.Close()
				return nil, fmt.Errorf("cgroup-bpf guard: denying %s: %w", p, err)
			}
			continue
		}
		a := p.Addr().As16()
		k := guardKey6{Prefixlen: uint32(p.Bits())}
		for i := range k.Addr {
			k.Addr[i] = binary.NativeEndian.Uint32(a[4*i:])
		}
		if err := g.objs.Deny6.Put(k, uint8(1)); err != nil {
			g.Close()
			return nil, fmt.Errorf("cgroup-bpf guard: denying %s: %w", p, err)
		}
	}
	for _, a := range dns {
		if a = a.Unmap(); a.Is4() {
			b := a.As4()
			if err := g.objs.Dns4.Put(binary.NativeEndian.Uint32(b[:]), uint8(1)); err != nil {
				g.Close()
				return nil, fmt.Errorf("cgroup-bpf guard: allowing resolver %s: %w", a, err)
			}
		}
	}
	for _, a := range []struct {
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{g.objs.Connect4, ebpf.AttachCGroupInet4Connect},
		{g.objs.Sendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{g.objs.Connect6, ebpf.AttachCGroupInet6Connect},
		{g.objs.Sendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{g.objs.SockCreate, ebpf.AttachCGroupInetSockCreate},
	} {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: a.at, Program: a.prog})
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("attaching the cgroup-bpf guard to %s: %w (%w)", dir, err, errdefs.ErrNotSupported)
		}
		g.links = append(g.links, l)
	}
	return g, nil
}

// Close detaches the programs.
func (g *Guard) Close() error {
	for _, l := range g.links {
		l.Close()
	}
	g.links = nil
	return g.objs.Close()
}
