package vminit

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/vm/vmconfig"
)

// setupNet brings the loopback interface up and, if c is set, configures
// the NIC whose MAC is c.MAC as a container sandbox's eth0 is: c.Addr as
// a /32, a permanent neighbour entry for the gateway and a default route
// through it (on-link), IPv6 off. The node routes and filters everything
// the guest sends (internal/network); nothing here is a security
// boundary, since the guest's root can undo it.
func setupNet(c *vmconfig.Net) error {
	for _, k := range []string{"all", "default", "lo"} {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("disabling IPv6: %w", err)
		}
	}
	h, err := netlink.NewHandle(syscall.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening rtnetlink: %w", err)
	}
	defer h.Close()
	if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}); err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}
	if c == nil {
		return nil
	}
	addr := net.ParseIP(c.Addr).To4()
	gw := net.ParseIP(c.Gateway).To4()
	mac, err1 := net.ParseMAC(c.MAC)
	gwMAC, err2 := net.ParseMAC(c.GatewayMAC)
	if addr == nil || gw == nil || err1 != nil || err2 != nil {
		return fmt.Errorf("bad network config %+v", *c)
	}
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	var nic netlink.Link
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == mac.String() {
			nic = l
		}
	}
	if nic == nil {
		return fmt.Errorf("no network interface with MAC %s", mac)
	}
	name := nic.Attrs().Name
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("disabling IPv6 on %s: %w", name, err)
	}
	if c.MTU > 0 {
		if err := h.LinkSetMTU(nic, c.MTU); err != nil {
			return fmt.Errorf("setting %s's MTU: %w", name, err)
		}
	}
	if err := h.AddrAdd(nic, &netlink.Addr{IPNet: &net.IPNet{IP: addr, Mask: net.CIDRMask(32, 32)}}); err != nil {
		return fmt.Errorf("adding %s to %s: %w", addr, name, err)
	}
	if err := h.LinkSetUp(nic); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	idx := nic.Attrs().Index
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: gwMAC}); err != nil {
		return fmt.Errorf("adding the gateway neighbour: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("adding the default route: %w", err)
	}
	return nil
}
