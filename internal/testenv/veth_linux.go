package testenv

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

// HostVeth adds the veth pair name/name+"p" (the peer in peerNS, a
// netlink.NsFd or NsPid, or in the node's namespace if nil), gives the
// node's end ip/bits, sets it up, and removes the pair when t ends. It
// holds LockHostNet for t: such a veth is a change of the host's network.
func HostVeth(t testing.TB, name string, peerNS any, ip net.IP, bits int) netlink.Link {
	t.Helper()
	LockHostNet(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p", PeerNamespace: peerNS}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("adding %s: %v", name, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	return link
}
