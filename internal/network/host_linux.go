package network

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// probeHost reads the node's addresses and uplinks, derives the zones and
// the firewall layout, and enables IPv4 forwarding on the uplinks (for the
// replies of masqueraded connections; each host-side veth gets it too).
// Preconditions: called from New only.
func (m *Manager) probeHost() error {
	addrs, err := dump(func() ([]netlink.Addr, error) { return m.nl.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("listing the node's addresses: %w", err)
	}
	rng := prefixRange(m.opt.Range)
	never := []addrRange{rng}
	privat := []addrRange{}
	for _, p := range neverPrefixes {
		never = append(never, prefixRange(p))
	}
	for _, p := range privatePrefixes {
		privat = append(privat, prefixRange(p))
	}
	for _, d := range m.opt.Deny {
		never = append(never, prefixRange(d))
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		bits, _ := a.Mask.Size()
		subnet := prefixRange(netip.PrefixFrom(ip, bits))
		if subnet.first <= rng.last && rng.first <= subnet.last {
			return errdefs.New(errdefs.Invalid, api.CodeInvalidNetworkOptions,
				"network range %s overlaps the node's network %s/%d", m.opt.Range, ip, bits)
		}
		never = append(never, addrRange{u32(ip), u32(ip)})
		if !ip.IsLoopback() && bits < 32 {
			privat = append(privat, subnet)
		}
	}
	m.zones = zones{never: mergeRanges(never), private: mergeRanges(privat)}

	uplinks := m.opt.HostIfaces
	if len(uplinks) == 0 {
		routes, err := dump(func() ([]netlink.Route, error) { return m.nl.RouteList(nil, netlink.FAMILY_V4) })
		if err != nil {
			return fmt.Errorf("listing the node's routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
				continue
			}
			if l, err := m.nl.LinkByIndex(r.LinkIndex); err == nil && !slices.Contains(uplinks, l.Attrs().Name) {
				uplinks = append(uplinks, l.Attrs().Name)
			}
		}
	}
	m.mtu = 0
	for _, u := range uplinks {
		l, err := m.nl.LinkByName(u)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", u, err)
		}
		if mtu := l.Attrs().MTU; m.mtu == 0 || mtu < m.mtu {
			m.mtu = mtu
		}
		if err := sysctlAt(m.conf4, u+"/forwarding", "1"); err != nil {
			return err
		}
	}
	if m.mtu == 0 {
		m.mtu = 1500
	}
	m.layout = layout{rng: m.opt.Range, never: m.zones.never, privat: m.zones.private, uplinks: m.opt.HostIfaces}
	m.resolvers = m.opt.DNS
	return nil
}

// sysctl writes value to /proc/sys/<name> of the calling thread's network
// namespace. A missing IPv6 sysctl (IPv6 off in the kernel) is not an
// error.
func sysctl(name, value string) error {
	return sysctlAt(nil, name, value)
}

// sysctlAt writes value to name below dir (a directory of /proc/sys, or
// /proc/sys itself when dir is nil).
//
// Writing relative to a directory matters at scale: the dentries of the
// per-namespace directories below /proc/sys/net (ipv4, ipv6) share one
// parent and name, so each lookup from /proc/sys walks a hash chain with
// one entry per live namespace (1-2 ms per write at 4,000).
func sysctlAt(dir *os.Root, name, value string) error {
	var err error
	if dir == nil {
		err = os.WriteFile("/proc/sys/"+name, []byte(value), 0)
	} else {
		err = dir.WriteFile(name, []byte(value), 0)
	}
	if errors.Is(err, fs.ErrNotExist) && (dir == nil && strings.HasPrefix(name, "net/ipv6/") || dir != nil && strings.Contains(dir.Name(), "ipv6")) {
		return nil
	}
	if err != nil {
		if dir != nil {
			name = strings.TrimPrefix(dir.Name(), "/proc/sys/") + "/" + name
		}
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

// openSysctlDirs opens /proc/sys/net/ipv4/conf and /proc/sys/net/ipv6/conf
// of the process's namespace (conf6 is nil without IPv6).
func openSysctlDirs() (conf4, conf6 *os.Root, err error) {
	type result struct {
		c4, c6 *os.Root
		err    error
	}
	ch := make(chan result, 1)
	go func() { // a fresh goroutine's thread is in the process's namespace
		c4, err := os.OpenRoot("/proc/sys/net/ipv4/conf")
		if err != nil {
			ch <- result{err: err}
			return
		}
		c6, err := os.OpenRoot("/proc/sys/net/ipv6/conf")
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			c4.Close()
			ch <- result{err: err}
			return
		}
		ch <- result{c4, c6, nil}
	}()
	r := <-ch
	return r.c4, r.c6, r.err
}

// MAC addresses: every host-side veth has the same one (as Calico does;
// each is its own link); a sandbox's is derived from its address.
var hostMAC = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}

func sandboxMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// hostIfName names the host-side veth of address a.
func (m *Manager) hostIfName(a netip.Addr) string {
	return fmt.Sprintf("%s%08x", m.opt.Name, u32(a))
}

// isHostIf reports whether name is the form of this Manager's host-side
// veths, and which address it stands for.
func (m *Manager) parseHostIf(name string) (netip.Addr, bool) {
	hex, ok := strings.CutPrefix(name, m.opt.Name)
	if !ok || len(hex) != 8 {
		return netip.Addr{}, false
	}
	var v uint32
	if _, err := fmt.Sscanf(hex, "%08x", &v); err != nil || fmt.Sprintf("%08x", v) != hex {
		return netip.Addr{}, false
	}
	return addrOf(v), true
}

// Resolvers returns the DNS resolvers offered to sandboxes.
func (m *Manager) Resolvers() []netip.Addr { return append([]netip.Addr(nil), m.resolvers...) }
