package network

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/sys"
)

// target is a destination a probe connects to.
type target struct {
	name string
	addr netip.Addr
	port int
}

// hostTargets are the node's own addresses (every one but loopback),
// with the port the node's test server listens on.
func hostTargets(t *testing.T, w *world) []target {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	must(t, err)
	var out []target
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if !ip.IsLoopback() {
			out = append(out, target{"node " + ip.String(), ip, w.hostPort})
		}
	}
	if len(out) == 0 {
		t.Fatal("the node has no address")
	}
	return out
}

// listenIn starts a test server in the namespace at netns on addr:port.
func listenIn(t *testing.T, w *world, netns, addr string) {
	t.Helper()
	must(t, EnterNetns(netns, func() error {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			return err
		}
		w.serve(ln)
		return nil
	}))
}

// expectReach dials every target from netns and checks the outcome.
func expectReach(t *testing.T, netns, who string, targets []target, want bool) {
	t.Helper()
	for _, tg := range targets {
		got, err := dial(netns, tg.addr, tg.port)
		if want && (err != nil || !strings.HasPrefix(got, "ok ")) {
			t.Errorf("%s → %s (%s:%d): got %q, %v; want a connection", who, tg.name, tg.addr, tg.port, got, err)
		}
		if !want && err == nil {
			t.Errorf("%s → %s (%s:%d): connected (%q); want refused", who, tg.name, tg.addr, tg.port, got)
		}
	}
}

func TestModeNoneReachesNothing(t *testing.T) {
	w := newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	a, err := m.Acquire(ctx, "a", Policy{})
	must(t, err)
	b, err := m.Acquire(ctx, "b", Policy{Mode: ModeOpen, Inbound: []Port{{ProtoTCP, 80}}})
	must(t, err)
	listenIn(t, w, b.NetnsPath, ":80")
	listenIn(t, w, a.NetnsPath, "127.0.0.1:80")

	targets := append(hostTargets(t, w),
		target{"internet", inetPublic, 80},
		target{"metadata", inetMetadata, 80},
		target{"10/8", inetPriv10, 80},
		target{"sandbox b", b.Addr, 80},
	)
	// The proof that each target is up and routed: the node reaches it.
	expectReach(t, "", "node", targets, true)
	expectReach(t, a.NetnsPath, "sandbox a", targets, false)
	expectReach(t, a.NetnsPath, "sandbox a", []target{{"gateway", a.Gateway, 80}}, false)
	// Its own loopback works.
	expectReach(t, a.NetnsPath, "sandbox a", []target{{"own lo", netip.MustParseAddr("127.0.0.1"), 80}}, true)
	if len(a.DNS) != 0 {
		t.Errorf("DNS under ModeNone = %v, want none", a.DNS)
	}
}

func TestModeOpenReachesOnlyThePublicInternet(t *testing.T) {
	w := newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	a, err := m.Acquire(ctx, "a", Policy{Mode: ModeOpen})
	must(t, err)
	b, err := m.Acquire(ctx, "b", Policy{Mode: ModeOpen, Inbound: []Port{{ProtoTCP, 80}}})
	must(t, err)
	listenIn(t, w, b.NetnsPath, ":80")

	got, err := dial(a.NetnsPath, inetPublic, 80)
	if err != nil || got != "ok "+uplinkHost.Addr().String() {
		t.Errorf("sandbox → internet: got %q, %v; want a connection masqueraded as %s", got, err, uplinkHost.Addr())
	}
	denied := append(hostTargets(t, w),
		target{"metadata", inetMetadata, 80},
		target{"10/8", inetPriv10, 80},
		target{"172.16/12", inetPriv172, 80},
		target{"192.168/16", inetPriv192, 80},
		target{"CGNAT", inetCGNAT, 80},
		target{"sandbox b", b.Addr, 80},
	)
	expectReach(t, "", "node", denied, true)
	expectReach(t, a.NetnsPath, "sandbox a", denied, false)
	// The node's resolver (private here) is offered, on port 53 only.
	if len(a.DNS) != 1 || a.DNS[0] != inetPriv10 {
		t.Errorf("DNS = %v, want [%s]", a.DNS, inetPriv10)
	}
}

func TestAllowlist(t *testing.T) {
	w := newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.Resolver = fakeResolver{"api.example": {inetPublic2}}
	m := newManager(t, opt)
	ctx := context.Background()
	b, err := m.Acquire(ctx, "b", Policy{Mode: ModeOpen, Inbound: []Port{{ProtoTCP, 80}}})
	must(t, err)
	listenIn(t, w, b.NetnsPath, ":80")
	node := hostTargets(t, w)[0]
	p := Policy{Mode: ModeAllowlist, Allow: []Rule{
		{Prefix: netip.PrefixFrom(inetPublic, 32), Proto: ProtoTCP, Ports: PortRange{8080, 8080}},
		{Host: "api.example", Proto: ProtoTCP, Ports: PortRange{9000, 9000}},
		{Prefix: netip.MustParsePrefix("10.99.0.0/24")}, // a private range, named explicitly
		// Listed, but never reachable:
		{Prefix: testRange},
		{Prefix: netip.PrefixFrom(node.addr, 32)},
		{Prefix: netip.MustParsePrefix("169.254.0.0/16")},
	}}
	a, err := m.Acquire(ctx, "a", p)
	must(t, err)

	allowed := []target{
		{"internet:8080", inetPublic, 8080},
		{"api.example:9000", inetPublic2, 9000},
		{"10.99.0.0/24 any port", inetPriv10, 80},
		{"10.99.0.0/24 other port", inetPriv10, 9000},
	}
	denied := []target{
		{"internet:80", inetPublic, 80},
		{"internet:9000", inetPublic, 9000},
		{"api.example:80", inetPublic2, 80},
		{"172.16/12", inetPriv172, 80},
		{"listed sandbox range", b.Addr, 80},
		{"listed node address", node.addr, node.port},
		{"listed metadata", inetMetadata, 80},
	}
	expectReach(t, "", "node", append(allowed, denied...), true)
	expectReach(t, a.NetnsPath, "sandbox a", allowed, true)
	expectReach(t, a.NetnsPath, "sandbox a", denied, false)
	if got := a.Hosts["api.example"]; len(got) != 1 || got[0] != inetPublic2 {
		t.Errorf("Hosts = %v, want api.example → %s", a.Hosts, inetPublic2)
	}
	if len(a.DNS) != 1 || a.DNS[0] != inetPriv10 {
		t.Errorf("DNS = %v, want [%s] (allowed by 10.99.0.0/24)", a.DNS, inetPriv10)
	}

	// Narrow it at run time: the next connection sees the new policy.
	must(t, m.SetPolicy(ctx, "a", Policy{Mode: ModeAllowlist, Allow: p.Allow[1:2]}))
	expectReach(t, a.NetnsPath, "sandbox a", allowed[:1], false)
	expectReach(t, a.NetnsPath, "sandbox a", allowed[1:2], true)
	expectReach(t, a.NetnsPath, "sandbox a", allowed[2:], false)
	if ep, _ := m.Endpoint("a"); len(ep.DNS) != 0 {
		t.Errorf("DNS after narrowing = %v, want none", ep.DNS)
	}
}

// fakeResolver resolves names from a map.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestPolicyChangeCutsOpenConnections(t *testing.T) {
	w := newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	a, err := m.Acquire(ctx, "a", Policy{Mode: ModeOpen})
	must(t, err)
	must(t, sysInNetns(w, func() error {
		ln, err := net.Listen("tcp4", ":7")
		if err != nil {
			return err
		}
		conns := make(chan net.Conn, 1)
		t.Cleanup(func() {
			ln.Close()
			// bounded: conns is closed when the accept loop ends with ln.Close
			if c, ok := <-conns; ok {
				c.Close()
			}
		})
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
			_, _ = io.Copy(c, c)
		}()
		return nil
	}))
	var c net.Conn
	must(t, EnterNetns(a.NetnsPath, func() (err error) {
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(inetPublic, 7).String(), 2*time.Second)
		return err
	}))
	defer c.Close()
	roundTrip := func() error {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err := c.Read(make([]byte, 1))
		return err
	}
	must(t, roundTrip())
	must(t, m.SetPolicy(ctx, "a", Policy{}))
	if err := roundTrip(); err == nil {
		t.Error("an open connection still works after the policy was set to none")
	}
}

func sysInNetns(w *world, fn func() error) error { return sys.InNetns(w.inet, fn) }

func TestUDPAndICMPDenialsFailFast(t *testing.T) {
	newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	a, err := m.Acquire(context.Background(), "a", Policy{})
	must(t, err)
	// A connected UDP socket learns of the admin-prohibited ICMP error.
	// The kernel rate-limits ICMP errors per destination (a burst of 6,
	// then one a second), so a few tries may be needed.
	start := time.Now()
	err = EnterNetns(a.NetnsPath, func() error {
		c, err := net.Dial("udp4", netip.AddrPortFrom(inetPublic, udpPort).String())
		if err != nil {
			return err
		}
		defer c.Close()
		for time.Since(start) < 3*time.Second {
			_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := c.Write([]byte("x")); err != nil {
				return err
			}
			if _, err = c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
		}
		return os.ErrDeadlineExceeded
	})
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("UDP to a denied destination: %v after %v; want an ICMP error", err, time.Since(start))
	}
}

func TestInboundOnlyOnExposedPorts(t *testing.T) {
	w := newWorld(t)
	m := newManager(t, testOptions(t, t.TempDir()))
	ctx := context.Background()
	a, err := m.Acquire(ctx, "a", Policy{Inbound: []Port{{ProtoTCP, 80}}})
	must(t, err)
	listenIn(t, w, a.NetnsPath, ":80")
	listenIn(t, w, a.NetnsPath, ":81")
	expectReach(t, "", "node", []target{{"exposed port", a.Addr, 80}}, true)
	expectReach(t, "", "node", []target{{"unexposed port", a.Addr, 81}}, false)
	// The proof that :81 is up: from inside the sandbox.
	expectReach(t, a.NetnsPath, "sandbox a", []target{{"own :81", a.Addr, 81}}, true)
	// The internet cannot connect in either (it has a route to the node).
	must(t, sysInNetns(w, func() error {
		expectReach(t, "", "internet", []target{{"exposed port", a.Addr, 80}}, false)
		return nil
	}))
	must(t, m.SetPolicy(ctx, "a", Policy{}))
	expectReach(t, "", "node", []target{{"port no longer exposed", a.Addr, 80}}, false)
}
