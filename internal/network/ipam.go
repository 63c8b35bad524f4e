package network

import (
	"fmt"
	"net/netip"
)

// ipam hands out the addresses of a range round-robin: an address comes
// back only after every other free one was used, so a released sandbox's
// address (whose veth and route the kernel removes asynchronously) is
// not reused while they may still exist. The first and last address of
// the range are never used. It is not safe for concurrent use.
type ipam struct {
	base uint32
	used []bool
	n    int // addresses in use
	next int
}

func newIPAM(p netip.Prefix) (*ipam, error) {
	p = p.Masked()
	if !p.Addr().Is4() || p.Bits() > 30 || p.Bits() < 8 {
		return nil, fmt.Errorf("range %s: want an IPv4 prefix between /8 and /30", p)
	}
	r := prefixRange(p)
	return &ipam{base: r.first, used: make([]bool, int(r.last-r.first)+1), next: 1}, nil
}

// alloc returns a free address, or false if none is left.
func (a *ipam) alloc() (netip.Addr, bool) {
	size := len(a.used)
	for range size {
		i := a.next
		a.next++
		if a.next >= size-1 {
			a.next = 1
		}
		if i == 0 || i == size-1 || a.used[i] {
			continue
		}
		a.used[i] = true
		a.n++
		return addrOf(a.base + uint32(i)), true
	}
	return netip.Addr{}, false
}

// mark records addr as used (an adopted sandbox's); it reports false if
// addr is outside the range or already used.
func (a *ipam) mark(addr netip.Addr) bool {
	i, ok := a.index(addr)
	if !ok || a.used[i] {
		return false
	}
	a.used[i] = true
	a.n++
	if i >= a.next {
		a.next = i + 1
		if a.next >= len(a.used)-1 {
			a.next = 1
		}
	}
	return true
}

// free returns addr to the range.
func (a *ipam) free(addr netip.Addr) {
	if i, ok := a.index(addr); ok && a.used[i] {
		a.used[i] = false
		a.n--
	}
}

func (a *ipam) index(addr netip.Addr) (int, bool) {
	if !addr.Is4() {
		return 0, false
	}
	v := u32(addr)
	if v < a.base || v-a.base >= uint32(len(a.used)) {
		return 0, false
	}
	return int(v - a.base), true
}
