package vmtier

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sys"
)

// tapName is the VM's tap device, in its sandbox's network namespace.
const tapName = "tap0"

// ingress is the handle of the ingress qdiscs the redirects hang off.
var ingress = netlink.MakeHandle(0xffff, 0)

// plugTap creates, in the network namespace at netnsPath (a
// network.Endpoint's), a tap device and returns its open file for QEMU
// and its MTU (eth0's),
// and joins the tap and the namespace's eth0 into a pure layer-2 pipe:
// tc ingress on each redirects every frame to the other's egress. The
// frames the guest sends leave through eth0 as a container's would, and
// every frame arriving on eth0 goes to the guest, stolen at ingress
// before the namespace's own IP stack sees it (eth0 keeps the address,
// which nothing in the namespace answers for: no process lives there).
// The tap goes with the last file open on it (QEMU's), the redirects
// with unplugTap.
func plugTap(netnsPath string) (*os.File, int, error) {
	var tap *os.File
	var mtu int
	err := network.EnterNetns(netnsPath, func() error {
		h, err := netlink.NewHandle(sys.NetlinkRoute)
		if err != nil {
			return fmt.Errorf("opening rtnetlink in the sandbox namespace: %w", err)
		}
		defer h.Close()
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("the sandbox's eth0: %w", err)
		}
		tt := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: tapName}, Mode: netlink.TUNTAP_MODE_TAP,
			Flags: netlink.TUNTAP_NO_PI, Queues: 1, NonPersist: true}
		if err := h.LinkAdd(tt); err != nil {
			return fmt.Errorf("creating %s: %w", tapName, err)
		}
		tap = tt.Fds[0]
		link, err := h.LinkByName(tapName)
		if err != nil {
			return err
		}
		mtu = eth0.Attrs().MTU
		if err := h.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("setting %s's MTU: %w", tapName, err)
		}
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("setting %s up: %w", tapName, err)
		}
		for _, p := range [][2]netlink.Link{{eth0, link}, {link, eth0}} {
			from, to := p[0].Attrs(), p[1].Attrs()
			if err := h.QdiscAdd(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: from.Index, Handle: ingress, Parent: netlink.HANDLE_INGRESS}}); err != nil {
				return fmt.Errorf("adding the ingress qdisc of %s: %w", from.Name, err)
			}
			f := &netlink.U32{ // no selector: matches every frame
				FilterAttrs: netlink.FilterAttrs{LinkIndex: from.Index, Parent: ingress, Priority: 1, Protocol: syscall.ETH_P_ALL},
				Actions:     []netlink.Action{netlink.NewMirredAction(to.Index)},
			}
			if err := h.FilterAdd(f); err != nil {
				return fmt.Errorf("redirecting %s to %s: %w", from.Name, to.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		if tap != nil {
			tap.Close()
		}
		_ = unplugTap(netnsPath)
		return nil, 0, err
	}
	return tap, mtu, nil
}

// unplugTap removes what plugTap added to the namespace at netnsPath,
// whatever of it is there: the tap (if QEMU has not taken it along) and
// eth0's ingress qdisc with its redirect, so that the namespace is as
// the network manager made it (Options.Reuse may pool it again).
func unplugTap(netnsPath string) error {
	return network.EnterNetns(netnsPath, func() error {
		h, err := netlink.NewHandle(sys.NetlinkRoute)
		if err != nil {
			return err
		}
		defer h.Close()
		var errs []error
		if l, err := h.LinkByName(tapName); err == nil {
			if err := h.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("deleting %s: %w", tapName, err))
			}
		}
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		qs, err := h.QdiscList(eth0)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_INGRESS {
				if err := h.QdiscDel(q); err != nil {
					errs = append(errs, fmt.Errorf("deleting eth0's ingress qdisc: %w", err))
				}
			}
		}
		return errors.Join(errs...)
	})
}
