package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
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
	// (A bound for a loaded host: the packets come in milliseconds.)
	deadline := time.Now().Add(10 * time.Second)
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

// TestFirstPacket: a sandbox's first packet, sent the moment its network
// is handed out, arrives. (The kernel's link watcher turns a new veth's
// noop qdisc into a working one a while after the carrier comes on; a
// network handed out before then dropped its first packets.)
func TestFirstPacket(t *testing.T) {
	w := newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = 0 // each network built by its Acquire, just before use
	m := newManager(t, opt)
	ctx := context.Background()
	const n = 25
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		ep, err := m.Acquire(ctx, id, Policy{Mode: ModeOpen})
		must(t, err)
		must(t, EnterNetns(ep.NetnsPath, func() error {
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(inetPublic, udpPort)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(id))
			return err
		}))
		must(t, m.Release(ctx, id))
	}
	// (A bound for a loaded host: the packets come in milliseconds.)
	for deadline := time.Now().Add(10 * time.Second); len(w.heard()) < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if heard := w.heard(); len(heard) != n {
		t.Errorf("the internet heard %d of %d first packets: %q", len(heard), n, heard)
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

// TestEnterNetnsRestoresThreads runs many EnterNetns calls, some failing,
// and checks that every thread the Go runtime schedules goroutines on is
// back in the process's namespace afterwards.
func TestEnterNetnsRestoresThreads(t *testing.T) {
	newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	a, err := m.Acquire(context.Background(), "a", Policy{})
	must(t, err)
	host, err := os.Readlink("/proc/thread-self/ns/net")
	must(t, err)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			err := EnterNetns(a.NetnsPath, func() error {
				if ns, _ := os.Readlink("/proc/thread-self/ns/net"); ns == host {
					return errors.New("still in the node's namespace")
				}
				if i%2 == 0 {
					return errors.New("fail on purpose")
				}
				return nil
			})
			if err != nil && err.Error() != "fail on purpose" {
				t.Error(err)
			}
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent namespace entries")
	for range 200 {
		wg.Go(func() {
			if ns, _ := os.Readlink("/proc/thread-self/ns/net"); ns != host {
				t.Errorf("a goroutine runs in %s, not the node's %s", ns, host)
			}
			runtime.Gosched()
		})
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent namespace entries")
	if err := EnterNetns("/nonexistent", func() error { return nil }); err == nil {
		t.Error("EnterNetns of a missing path succeeded")
	}
}

// TestNodeLoopbackThroughTheGateway sends to the node's 127.0.0.1 through
// the gateway. The kernel drops such packets as martians unless
// route_localnet is on; the test turns it on (the node's root could), so
// the SYN reaches the input hook, where the firewall refuses it. This
// test cannot show that the firewall alone stops it: with the input chain
// flushed by hand, the node's answer from 127.0.0.1 still never leaves
// (the kernel will not route a loopback source out of a veth), so it
// guards against regressions in either layer.
func TestNodeLoopbackThroughTheGateway(t *testing.T) {
	w := newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	a, err := m.Acquire(context.Background(), "a", Policy{Mode: ModeOpen})
	must(t, err)
	loopback := []target{{"node 127.0.0.1", netip.MustParseAddr("127.0.0.1"), w.hostPort}}
	expectReach(t, "", "node", loopback, true)
	must(t, sysctlAt(m.conf4, a.HostIf+"/route_localnet", "1"))
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
		routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 255}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst != nil && r.Dst.IP.IsLoopback() {
				if err := h.RouteDel(&r); err != nil {
					return err
				}
			}
		}
		// The sandbox must accept the answer from 127.0.0.1 on eth0 too.
		if err := sysctl("net/ipv4/conf/eth0/route_localnet", "1"); err != nil {
			return err
		}
		return h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("127.0.0.0/8")),
			Gw: net.IP(a.Gateway.AsSlice()), Flags: int(netlink.FLAG_ONLINK), Src: net.IP(a.Addr.AsSlice())})
	}))
	expectReach(t, a.NetnsPath, "sandbox a", loopback, false)
}

func TestIPv6IsOff(t *testing.T) {
	newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	a, err := m.Acquire(context.Background(), "a", Policy{Mode: ModeOpen})
	must(t, err)
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		must(t, err)
		return strings.TrimSpace(string(b))
	}
	if v := read("/proc/sys/net/ipv6/conf/" + a.HostIf + "/disable_ipv6"); v != "1" {
		t.Errorf("host veth disable_ipv6 = %s, want 1", v)
	}
	must(t, EnterNetns(a.NetnsPath, func() error {
		for _, dev := range []string{"all", "default", "lo", "eth0"} {
			if v := read("/proc/sys/net/ipv6/conf/" + dev + "/disable_ipv6"); v != "1" {
				t.Errorf("sandbox %s disable_ipv6 = %s, want 1", dev, v)
			}
		}
		for _, dst := range []string{"[fd00:ec2::254]:80", "[2001:db8::1]:80", "[::1]:80"} {
			if c, err := net.DialTimeout("tcp6", dst, time.Second); err == nil {
				c.Close()
				t.Errorf("sandbox connected to %s over IPv6", dst)
			}
		}
		return nil
	}))
}
