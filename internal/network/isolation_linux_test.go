package network

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/sys"
)

func TestAntiSpoofing(t *testing.T) {
	w := newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	a, err := m.Acquire(ctx, "a", Policy{Mode: ModeOpen})
	must(t, err)
	b, err := m.Acquire(ctx, "b", Policy{Mode: ModeOpen})
	must(t, err)
	forgedPublic := netip.MustParseAddr("198.51.100.77")
	send := func(src netip.Addr, payload string) error {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)),
			net.UDPAddrFromAddrPort(netip.AddrPortFrom(inetPublic, udpPort)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	}
	// A sandbox's root cannot add addresses (TestSandboxRootCannotChangeItsNetwork);
	// the node's root, as this test is, can: it stands for any way of
	// forging a source.
	must(t, EnterNetns(a.NetnsPath, func() error {
		h, err := netlink.NewHandle(sys.NetlinkRoute)
		if err != nil {
			return err
		}
		defer h.Close()
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, forged := range []netip.Addr{b.Addr, forgedPublic} {
			if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: hostNet(forged)}); err != nil {
				return err
			}
		}
		for _, m := range []struct {
			src     netip.Addr
			payload string
		}{{a.Addr, "a"}, {b.Addr, "a-as-b"}, {forgedPublic, "a-as-public"}} {
			if err := send(m.src, m.payload); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, EnterNetns(b.NetnsPath, func() error { return send(b.Addr, "b") }))
	deadline := time.Now().Add(2 * time.Second)
	for !(slices.Contains(w.heard(), "a") && slices.Contains(w.heard(), "b")) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let forged packets arrive, if they would
	heard := w.heard()
	for _, want := range []string{"a", "b"} {
		if !slices.Contains(heard, want) {
			t.Errorf("the internet did not hear %q (heard %q)", want, heard)
		}
	}
	for _, forged := range []string{"a-as-b", "a-as-public"} {
		if slices.Contains(heard, forged) {
			t.Errorf("a forged packet got through: %q (heard %q)", forged, heard)
		}
	}
}

func TestSandboxRootCannotChangeItsNetwork(t *testing.T) {
	newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	a, err := m.Acquire(context.Background(), "a", Policy{})
	must(t, err)
	// The proof that the probe sees success where there is some: the
	// node's root may do all of it.
	root := probeCaps(t, a.NetnsPath, false)
	for _, c := range slices.Concat(adminChecks, userChecks) {
		if root[c] != "ok" {
			t.Errorf("node root: %s: %s, want ok", c, root[c])
		}
	}
	sandbox := probeCaps(t, a.NetnsPath, true)
	for _, c := range adminChecks {
		if r := sandbox[c]; !strings.Contains(r, "operation not permitted") && !strings.Contains(r, "permission denied") {
			t.Errorf("sandbox root: %s: %q, want EPERM or EACCES", c, r)
		}
	}
	for _, c := range userChecks {
		if sandbox[c] != "ok" {
			t.Errorf("sandbox root: %s: %s, want ok", c, sandbox[c])
		}
	}
	t.Logf("sandbox root: %v", sandbox)
}
