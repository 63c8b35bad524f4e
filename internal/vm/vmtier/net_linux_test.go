package vmtier

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// The network tests' names: a Manager name and range of this process's
// own (other test binaries run theirs at the same time), an outside host
// behind a veth, and one port every test server listens on.
var (
	netName   = fmt.Sprintf("mv%04x", os.Getpid()&0xffff)
	netRange  = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100, byte(os.Getpid() % 250), 0}), 24)
	farAddr   = netip.MustParseAddr("198.51.100.2") // the outside host, allowed
	farHost   = netip.MustParseAddr("198.51.100.1") // the node's end of its veth
	metaAddr  = netip.MustParseAddr("169.254.169.254")
	privAddr  = netip.AddrFrom4([4]byte{172, 31, byte(os.Getpid() % 250), 1}) // private, behind the outside host
	gatewayIP = network.DefaultGateway
)

const testPort = 18080

// netEnv is a network manager and what the probes reach: the outside
// host (farAddr, and metaAddr and privAddr routed to it), a server of the
// node's on every address, and another sandbox's network with a server.
type netEnv struct {
	opt  network.Options
	nets *network.Manager
	node netip.Addr // an address of the node's (its uplink's)
	peer *network.Endpoint
}

// newNetEnv builds the outside host, then the Manager (which then counts
// the outside host's subnet among the node's private ones), then the
// peer sandbox's network. Everything goes when the test ends, and
// nothing of the Manager may be left.
func newNetEnv(t *testing.T, reuse bool) *netEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces, taps and nftables need root")
	}
	e := &netEnv{}
	outsideHost(t)
	serveHTTP(t, nil, "tcp4", fmt.Sprintf(":%d", testPort), "node")

	dir := t.TempDir()
	e.opt = network.Options{Name: netName, Range: netRange, StateDir: dir, PoolSize: -1, Logger: testLogger(t)}
	if reuse {
		e.opt.PoolSize, e.opt.Reuse = 1, true
	}
	nets, err := network.New(context.Background(), e.opt)
	if err != nil {
		t.Fatal(err)
	}
	e.nets = nets
	t.Cleanup(func() {
		ctx := context.Background()
		for _, id := range e.liveIDs() {
			if err := e.nets.Release(ctx, id); err != nil {
				t.Errorf("release %s: %v", id, err)
			}
		}
		if err := e.nets.Close(ctx); err != nil {
			t.Errorf("closing the network manager: %v", err)
		}
		e.checkGone(t, "")
	})
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if !ip.IsLoopback() && ip != farHost {
			e.node = ip
			break
		}
	}
	if !e.node.IsValid() {
		t.Fatal("the node has no address")
	}
	// The peer: another sandbox's network, which lets the node in on
	// testPort (the control that its server answers).
	e.peer, err = nets.Acquire(context.Background(), "mvm-peer", network.Policy{Inbound: []network.Port{{Proto: network.ProtoTCP, Port: testPort}}})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := sys.OpenNetns(e.peer.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	serveHTTP(t, ns, "tcp4", fmt.Sprintf("%s:%d", e.peer.Addr, testPort), "peer")
	return e
}

// liveIDs are the sandboxes with a network.
func (e *netEnv) liveIDs() []string {
	var ids []string
	for _, id := range []string{"mvm-peer", "mvm-net1", "mvm-net2", "mvm-reuse"} {
		if _, ok := e.nets.Endpoint(id); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// newNetRuntime is newRuntime with e's Manager.
func newNetRuntime(t *testing.T, e *netEnv) (*Runtime, string) {
	t.Helper()
	rt, dir := newRuntime(t)
	rt.opt.Network = e.nets
	return rt, dir
}

// outsideHost makes a namespace behind a veth (node end farHost/30, far
// end farAddr/30) with metaAddr and privAddr on its loopback, routed to
// it from the node, and a server on every address: without the firewall
// all three are reachable from the node (checked), as they would be
// from a sandbox.
func outsideHost(t *testing.T) {
	t.Helper()
	name := fmt.Sprintf("mvo%04x", os.Getpid()&0xffff)
	ns, err := sys.NewNetns(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	testenv.HostVeth(t, name, netlink.NsFd(int(ns.Fd())), farHost.AsSlice(), 30)
	// Replies come back in through it on their way to the sandbox.
	must(t, os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/forwarding", []byte("1"), 0o644))
	for _, a := range []netip.Addr{metaAddr, privAddr} {
		r := &netlink.Route{Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: farAddr.AsSlice()}
		must(t, netlink.RouteAdd(r))
		t.Cleanup(func() { _ = netlink.RouteDel(r) })
	}
	must(t, sys.InNetns(ns, func() error {
		peer, err := netlink.LinkByName(name + "p")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: farAddr.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(peer); err != nil {
			return err
		}
		lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		for _, a := range []netip.Addr{metaAddr, privAddr} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		return netlink.RouteAdd(&netlink.Route{Gw: farHost.AsSlice()})
	}))
	serveHTTP(t, ns, "tcp4", fmt.Sprintf(":%d", testPort), "far")
	for _, a := range []netip.Addr{farAddr, metaAddr, privAddr} {
		if got := hostGet(a); got != "far" {
			t.Fatalf("control: the node reaches the outside host at %s: %q", a, got)
		}
	}
}

// serveHTTP serves "dsec-ok <name>" on addr, from namespace ns (nil: the
// node's), until the test ends.
func serveHTTP(t *testing.T, ns *os.File, proto, addr, name string) {
	t.Helper()
	var ln net.Listener
	listen := func() error {
		var err error
		ln, err = net.Listen(proto, addr)
		return err
	}
	var err error
	if ns != nil {
		err = sys.InNetns(ns, listen)
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "dsec-ok %s\n", name)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// hostGet fetches a test server's name from the node, or returns the
// error's text.
func hostGet(a netip.Addr) string {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://%s:%d/", a, testPort))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var b [64]byte
	n, _ := resp.Body.Read(b[:])
	return strings.TrimPrefix(strings.TrimSpace(string(b[:n])), "dsec-ok ")
}

// guestGet fetches a test server's name from the guest with busybox nc:
// the name, or "" if the server was not reached.
func guestGet(t *testing.T, sb sandbox.Sandbox, a netip.Addr) string {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		// (busybox-static's wget crashes in the guest: nc speaks HTTP.)
		Cmd: sh(`printf 'GET / HTTP/1.0\r\n\r\n' | timeout 6 nc -w 4 "$1" "$2" 2>&1 | tail -n 1`, a.String(), fmt.Sprint(testPort))}})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if name, ok := strings.CutPrefix(strings.TrimSpace(res.Stdout), "dsec-ok "); ok && res.ExitCode == 0 {
		return name
	}
	t.Logf("nc %s from the guest: %q", a, strings.TrimSpace(res.Stdout))
	return ""
}

func guestRun(t *testing.T, sb sandbox.Sandbox, script string, args ...string) api.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(script, args...)}})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}

// allowFar allows the outside host's server.
func allowFar() *api.NetworkPolicy {
	return &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: farAddr.String() + "/32", Proto: "tcp", Ports: fmt.Sprint(testPort)}}}
}

// leftovers lists what of sandbox id's network (address addr, if known)
// is on the node: its namespace, host veth, route, nftables elements,
// and any tap. With id empty: everything of the Manager's.
func (e *netEnv) leftovers(id string, addr netip.Addr) []string {
	var out []string
	all := id == ""
	if ents, err := os.ReadDir(network.DefaultNetnsDir); err == nil {
		for _, ent := range ents {
			if all && strings.HasPrefix(ent.Name(), e.opt.Name+"-") || ent.Name() == e.opt.Name+"-"+id {
				out = append(out, "netns "+ent.Name())
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		n := l.Attrs().Name
		if addr.IsValid() && n == fmt.Sprintf("%s%08x", e.opt.Name, addr.As4()) || all && strings.HasPrefix(n, e.opt.Name) || strings.HasPrefix(n, tapName) {
			out = append(out, "link "+n)
		}
	}
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && (addr.IsValid() && a == addr || all && e.opt.Range.Contains(a)) {
			out = append(out, "route "+r.Dst.String())
		}
	}
	switch {
	case all:
		if ok, err := testenv.NftTableExists(e.opt.Name); ok || err != nil {
			out = append(out, fmt.Sprintf("table inet %s (%v)", e.opt.Name, err))
		}
	case addr.IsValid():
		if ok, err := testenv.NftHasAddr(e.opt.Name, addr); ok || err != nil {
			out = append(out, fmt.Sprintf("nftables elements of %s (%v)", addr, err))
		}
	}
	return out
}

// checkGone waits up to 20 s for the kernel to remove sandbox id's
// network (every sandbox's of the Manager if id is empty), then fails
// the test on what is left.
func (e *netEnv) checkGone(t *testing.T, id string, addr ...netip.Addr) {
	t.Helper()
	var a netip.Addr
	if len(addr) > 0 {
		a = addr[0]
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := e.leftovers(id, a)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left on the node: %q", left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// TestNetwork boots one microVM with a network and checks, in order, on
// the same VM: its guest-side config, its allowlist, the deny-set (each
// destination with a control that it answers) under allowlist and under
// open with every denied destination listed, the node's 127.0.0.1
// through the gateway, egress none and policy changes on the next
// connection, anti-spoofing, recovery by a new runtime and network
// manager (shared with another tier), and that Destroy leaves nothing.
func TestNetwork(t *testing.T) {
	e := newNetEnv(t, false)
	rt, dir := newNetRuntime(t, e)
	ctx := ctxT(t, 5*time.Minute)
	start := time.Now()
	spec := busyboxSpec("mvm-net1", Tier)
	spec.Network = allowFar()
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	msb := sb.(*Sandbox)
	t.Logf("create to ready with a network: %v (hello %v)", time.Since(start).Round(time.Millisecond), msb.timing.Hello.Round(time.Millisecond))
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			sb.Destroy(context.Background())
		}
	})
	ep, ok := e.nets.Endpoint("mvm-net1")
	if !ok {
		t.Fatal("no endpoint for the VM")
	}
	top := t

	t.Run("GuestConfig", func(t *testing.T) {
		if os.Getenv("DSEC_DEBUG_NET") != "" {
			t.Log(guestRun(t, sb, `ip addr; ip route; ip neigh`).Stdout)
			out, _ := exec.Command("sh", "-c", "ip netns exec "+filepath.Base(ep.NetnsPath)+" sh -c 'ip -s link; tc filter show dev eth0 ingress; tc filter show dev tap0 ingress'").CombinedOutput()
			t.Log(string(out))
		}
		res := guestRun(t, sb, `ip -4 addr show; ip route; cat /etc/hosts; cat /proc/sys/net/ipv6/conf/all/disable_ipv6`)
		for _, want := range []string{ep.Addr.String() + "/32", "default via " + gatewayIP.String(), ep.Addr.String() + "\tmvm-net1"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("guest network config lacks %q:\n%s", want, res.Stdout)
			}
		}
		if !strings.HasSuffix(strings.TrimSpace(res.Stdout), "1") {
			t.Errorf("IPv6 not disabled in the guest:\n%s", res.Stdout)
		}
	})

	t.Run("Allowlist", func(t *testing.T) {
		if got := guestGet(t, sb, farAddr); got != "far" {
			t.Fatalf("the allowed outside host: got %q", got)
		}
	})

	// denied are the deny-set's destinations, each with a server that
	// answers the node (the control).
	denied := []struct {
		name string
		addr netip.Addr
	}{
		{"node address", e.node},
		{"gateway", gatewayIP},
		{"metadata", metaAddr},
		{"other sandbox", e.peer.Addr},
		{"private range not allowed", privAddr},
	}
	for _, d := range denied {
		if d.addr == gatewayIP {
			continue // no server: the node has no such address
		}
		if got := hostGet(d.addr); got == "" || strings.Contains(got, " ") {
			t.Fatalf("control: the node reaches the %s (%s): %q", d.name, d.addr, got)
		}
	}
	checkDenied := func(t *testing.T) {
		for _, d := range denied {
			if got := guestGet(t, sb, d.addr); got != "" {
				t.Errorf("the VM reached the %s (%s): %q", d.name, d.addr, got)
			}
		}
	}
	t.Run("DenySet", checkDenied)

	t.Run("DenySetUnderOpen", func(t *testing.T) {
		// Open, with every denied destination listed: the never-reachable
		// ones stay denied; the private one, listed, opens (its control).
		open := &api.NetworkPolicy{Egress: api.EgressOpen}
		for _, a := range []netip.Addr{farAddr, e.node, metaAddr, e.peer.Addr} {
			open.Allow = append(open.Allow, api.NetworkRule{CIDR: a.String() + "/32"})
		}
		must(t, rt.setNetworkPolicy(ctx, msb, open))
		checkDenied(t)
		open.Allow = append(open.Allow, api.NetworkRule{CIDR: privAddr.String() + "/32"})
		must(t, rt.setNetworkPolicy(ctx, msb, open))
		if got := guestGet(t, sb, privAddr); got != "far" {
			t.Errorf("control: the private address, allowed: got %q", got)
		}
		for _, d := range denied[:4] {
			if got := guestGet(t, sb, d.addr); got != "" {
				t.Errorf("the VM reached the %s (%s) under open: %q", d.name, d.addr, got)
			}
		}
	})

	t.Run("LoopbackViaGateway", func(t *testing.T) {
		// Still open. The guest's root routes 127.0.0.1 out through the
		// gateway, at the node's loopback server: the frames reach the
		// node (the control: its veth counts them) and get nowhere.
		host, err := netlink.LinkByName(ep.HostIf)
		if err != nil {
			t.Fatal(err)
		}
		res := guestRun(t, sb, `set -e
for k in all eth0; do echo 1 > /proc/sys/net/ipv4/conf/$k/route_localnet; done
ip route del local 127.0.0.0/8 dev lo table local
ip route del local 127.0.0.1 dev lo table local
ip route add 127.0.0.1/32 via "$1" dev eth0 onlink
ip route get 127.0.0.1`, gatewayIP.String())
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "dev eth0") {
			t.Fatalf("routing 127.0.0.1 through the gateway: %+v", res)
		}
		if got := hostGet(netip.MustParseAddr("127.0.0.1")); got != "node" {
			t.Fatalf("control: the node's server on 127.0.0.1: %q", got)
		}
		before := host.Attrs().Statistics.RxPackets
		if got := guestGet(t, sb, netip.MustParseAddr("127.0.0.1")); got != "" {
			t.Errorf("the VM reached the node's 127.0.0.1: %q", got)
		}
		host, err = netlink.LinkByName(ep.HostIf)
		if err != nil {
			t.Fatal(err)
		}
		if n := host.Attrs().Statistics.RxPackets - before; n == 0 {
			t.Error("control: no frame of the probe reached the node's veth")
		}
		res = guestRun(t, sb, `ip route del 127.0.0.1/32; ip addr del 127.0.0.1/8 dev lo; ip addr add 127.0.0.1/8 dev lo; ip route get 127.0.0.1`)
		if !strings.Contains(res.Stdout, "dev lo") {
			t.Errorf("restoring the guest's loopback: %+v", res)
		}
	})

	t.Run("PolicyChange", func(t *testing.T) {
		s := time.Now()
		must(t, rt.setNetworkPolicy(ctx, msb, &api.NetworkPolicy{Egress: api.EgressNone}))
		toNone := time.Since(s)
		if got := guestGet(t, sb, farAddr); got != "" {
			t.Errorf("egress none: the VM reached the outside host: %q", got)
		}
		for _, d := range denied {
			if got := guestGet(t, sb, d.addr); got != "" {
				t.Errorf("egress none: the VM reached the %s (%s): %q", d.name, d.addr, got)
			}
		}
		s = time.Now()
		must(t, rt.setNetworkPolicy(ctx, msb, allowFar()))
		toAllow := time.Since(s)
		if got := guestGet(t, sb, farAddr); got != "far" {
			t.Errorf("allowlist again: got %q", got)
		}
		// Latency as the guest sees it: SetPolicy to the first
		// connection that gets through (one wget, started at once).
		must(t, rt.setNetworkPolicy(ctx, msb, &api.NetworkPolicy{Egress: api.EgressNone}))
		s = time.Now()
		must(t, rt.setNetworkPolicy(ctx, msb, allowFar()))
		got := guestGet(t, sb, farAddr)
		seen := time.Since(s)
		if got != "far" {
			t.Errorf("allowlist, third time: got %q", got)
		}
		t.Logf("setNetworkPolicy: to none %v, to allowlist %v; allowlist to a guest connection through %v",
			toNone.Round(time.Microsecond), toAllow.Round(time.Microsecond), seen.Round(time.Millisecond))
	})

	t.Run("Spoofing", func(t *testing.T) {
		// The guest's root moves its address to another sandbox's (and
		// to one outside the range): the node drops what it sends.
		for _, spoof := range []netip.Addr{e.peer.Addr, netip.MustParseAddr("198.51.100.77")} {
			res := guestRun(t, sb, `ip addr add "$2/32" dev eth0 && ip addr del "$1/32" dev eth0 && ip route replace default via "$3" dev eth0 onlink && ip -4 addr show dev eth0`,
				ep.Addr.String(), spoof.String(), gatewayIP.String())
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, spoof.String()) || strings.Contains(res.Stdout, ep.Addr.String()+"/") {
				t.Fatalf("changing the guest's address: %+v", res)
			}
			if got := guestGet(t, sb, farAddr); got != "" {
				t.Errorf("from the spoofed %s the VM reached the outside host: %q", spoof, got)
			}
			res = guestRun(t, sb, `ip addr add "$1/32" dev eth0 && ip addr del "$2/32" dev eth0 && ip route replace default via "$3" dev eth0 onlink`,
				ep.Addr.String(), spoof.String(), gatewayIP.String())
			if res.ExitCode != 0 {
				t.Fatalf("restoring the guest's address: %+v", res)
			}
			if got := guestGet(t, sb, farAddr); got != "far" {
				t.Errorf("control: back on its own address, the outside host: %q", got)
			}
		}
	})

	t.Run("Recover", func(t *testing.T) {
		// A node restart: runtime and network manager closed (the VM and
		// its network stay), new ones adopt them.
		must(t, rt.Close(ctx))
		must(t, e.nets.Close(ctx))
		nets, err := network.New(ctx, e.opt)
		if err != nil {
			t.Fatal(err)
		}
		e.nets = nets
		// Shared as the daemon shares it with the container tier, whose
		// Recover (here: the peer's) keeps its sandboxes' networks.
		views := nets.Share(2)
		rt2, err := New(ctx, rt.opt)
		if err != nil {
			t.Fatal(err)
		}
		rt2.opt.Network = views[0]
		top.Cleanup(func() { rt2.Close(context.Background()) })
		must(t, views[1].Recover(ctx, []string{"mvm-peer"}))
		sbs, err := rt2.Recover(ctx)
		if err != nil || len(sbs) != 1 {
			t.Fatalf("Recover: %v, %v", sbs, err)
		}
		sb, msb = sbs[0], sbs[0].(*Sandbox)
		if msb.netns != ep.NetnsPath {
			t.Errorf("recovered netns %q, want %q", msb.netns, ep.NetnsPath)
		}
		if _, ok := nets.Endpoint("mvm-peer"); !ok {
			t.Error("the peer's network did not survive the microvm tier's Recover")
		}
		if got := guestGet(t, sb, farAddr); got != "far" {
			t.Errorf("after recovery, the allowed outside host: %q", got)
			elems, err := testenv.NftElements(e.opt.Name)
			t.Logf("nftables sets of inet %s: %v %v", e.opt.Name, elems, err)
		}
		if got := guestGet(t, sb, e.node); got != "" {
			t.Errorf("after recovery, the node: %q", got)
		}
		must(t, rt2.setNetworkPolicy(ctx, msb, &api.NetworkPolicy{Egress: api.EgressNone}))
		if got := guestGet(t, sb, farAddr); got != "" {
			t.Errorf("after recovery, egress none: %q", got)
		}
	})

	t.Run("Destroy", func(t *testing.T) {
		// The control for checkGone's nftables check: the live VM's
		// address is in the table's sets.
		if ok, err := testenv.NftHasAddr(e.opt.Name, ep.Addr); !ok || err != nil {
			t.Errorf("before Destroy, no nftables element holds %s: %v", ep.Addr, err)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		destroyed = true
		if ps := qemuProcs(dir); len(ps) > 0 {
			t.Errorf("QEMU left after Destroy: %+v", ps)
		}
		e.checkGone(t, "mvm-net1", ep.Addr)
		if st := e.nets.Stats(); st.Live != 1 {
			t.Errorf("networks after Destroy: %+v, want only the peer's", st)
		}
	})
}

// TestNetworkFailedCreate: a create that fails after its network was
// plugged (boot timeout) leaves nothing of it; with Options.Reuse the
// slot comes back clean (no tap, no redirect, eth0 with its address).
func TestNetworkFailedCreate(t *testing.T) {
	e := newNetEnv(t, true)
	rt, _ := newNetRuntime(t, e)
	rt.opt.BootTimeout = 300 * time.Millisecond
	spec := busyboxSpec("mvm-net2", Tier)
	spec.Network = allowFar()
	_, err := rt.Create(ctxT(t, time.Minute), spec)
	if err == nil {
		t.Fatal("Create with a 300 ms boot timeout succeeded")
	}
	t.Logf("Create: %v", err)
	if _, ok := e.nets.Endpoint("mvm-net2"); ok {
		t.Error("the failed create's network is still live")
	}
	e.checkGone(t, "mvm-net2")
	if st := e.nets.Stats(); st.Live != 1 {
		t.Errorf("networks after the failed create: %+v, want only the peer's", st)
	}
	// The next sandbox gets a clean namespace, whether pooled or new.
	ep, err := e.nets.Acquire(context.Background(), "mvm-reuse", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := sys.OpenNetns(ep.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	must(t, sys.InNetns(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		var names []string
		for _, l := range links {
			names = append(names, l.Attrs().Name)
			if l.Attrs().Name != "eth0" {
				continue
			}
			qs, _ := netlink.QdiscList(l)
			for _, q := range qs {
				if q.Attrs().Parent == netlink.HANDLE_INGRESS {
					t.Errorf("eth0 of a reused slot has an ingress qdisc: %v", q)
				}
			}
			addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
			if len(addrs) != 1 || !addrs[0].IP.Equal(ep.Addr.AsSlice()) {
				t.Errorf("eth0 of the next slot has %v, want %s", addrs, ep.Addr)
			}
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"eth0", "lo"}) {
			t.Errorf("links of the next slot: %v", names)
		}
		return nil
	}))
}

// TestNetworkBootTime measures create-to-hello with and without a
// network, DSEC_TEST_MICROVM_NETBENCH=<n> boots each, alternating (make
// bench: 5, its smoke run: 1).
func TestNetworkBootTime(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("DSEC_TEST_MICROVM_NETBENCH"))
	if err != nil || n < 1 {
		t.Skip("set DSEC_TEST_MICROVM_NETBENCH=<boots of each kind> to measure (TCG boots)")
	}
	e := newNetEnv(t, false)
	rt, _ := newNetRuntime(t, e)
	ctx := ctxT(t, 10*time.Minute)
	hello := map[bool][]time.Duration{}
	var plug []time.Duration
	for i := range 2 * n {
		withNet := i%2 == 1
		spec := busyboxSpec(fmt.Sprintf("mvm-b%d", i), Tier)
		if withNet {
			spec.Network = allowFar()
		}
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		tm := sb.(*Sandbox).timing
		hello[withNet] = append(hello[withNet], tm.Hello)
		if withNet {
			plug = append(plug, tm.Network)
			if i == 1 {
				if got := guestGet(t, sb, farAddr); got != "far" {
					t.Errorf("the outside host: %q", got)
				}
			}
		}
		must(t, sb.Destroy(ctx))
	}
	for _, withNet := range []bool{false, true} {
		h := hello[withNet]
		slices.Sort(h)
		t.Logf("network %v: create to hello p50 %v (min %v, max %v)", withNet,
			h[n/2].Round(time.Millisecond), h[0].Round(time.Millisecond), h[n-1].Round(time.Millisecond))
	}
	slices.Sort(plug)
	t.Logf("network acquire + tap plug: p50 %v (max %v)", plug[n/2].Round(time.Microsecond), plug[n-1].Round(time.Microsecond))
}
