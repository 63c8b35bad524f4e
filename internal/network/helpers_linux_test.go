package network

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode, os.Args))
	}
	code := m.Run()
	removeHelper()
	os.Exit(code)
}

// Every test Manager of this process shares a name and range of its own,
// so that a concurrent test run (or the node's real Manager) is not swept.
var (
	testName  = fmt.Sprintf("dt%04x", os.Getpid()&0xffff)
	testRange = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(160 + os.Getpid()%64), 0, 0}), 16)
	// The fake internet and its uplink.
	uplinkName = fmt.Sprintf("du%04x", os.Getpid()&0xffff)
	uplinkHost = netip.MustParsePrefix("203.0.113.1/30")
	uplinkPeer = netip.MustParsePrefix("203.0.113.2/30")
)

// Addresses inside the fake internet's namespace, routed there from the node.
var (
	inetPublic   = netip.MustParseAddr("198.51.100.1") // TEST-NET-2: "the internet"
	inetPublic2  = netip.MustParseAddr("198.51.100.2")
	inetMetadata = netip.MustParseAddr("169.254.170.2") // link-local, like 169.254.169.254
	inetPriv10   = netip.MustParseAddr("10.99.0.1")
	inetPriv172  = netip.MustParseAddr("172.16.5.1")
	inetPriv192  = netip.MustParseAddr("192.168.77.1")
	inetCGNAT    = netip.MustParseAddr("100.64.0.1")
	inetAddrs    = []netip.Addr{inetPublic, inetPublic2, inetMetadata, inetPriv10, inetPriv172, inetPriv192, inetCGNAT}
	inetPorts    = []int{80, 8080, 9000}
)

// needRoot skips tests that need root and a kernel with network
// namespaces and nftables.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces, veths and nftables need root")
	}
	if _, err := os.Stat("/proc/sys/net/netfilter"); err != nil {
		t.Skipf("no netfilter in this kernel: %v", err)
	}
}

// testOptions are the options of every test Manager.
func testOptions(t testing.TB, stateDir string) Options {
	return Options{
		Range:      testRange,
		Name:       testName,
		StateDir:   stateDir,
		HostIfaces: []string{uplinkName},
		DNS:        []netip.Addr{inetPriv10},
		PoolSize:   4,
		Logger:     testLogger(t),
	}
}

// newManager starts a Manager and checks, when the test ends, that nothing
// of it is left on the node (after removing whatever is, so the next test
// starts clean).
func newManager(t testing.TB, opt Options) *Manager {
	t.Helper()
	needRoot(t)
	goroutines := testenv.Goroutines()
	m, err := New(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		m.mu.Lock()
		var ids []string
		for id := range m.eps {
			ids = append(ids, id)
		}
		closed := m.closed
		m.mu.Unlock()
		if closed { // the test closed it; a later Manager cleans up
			return
		}
		for _, id := range ids {
			if err := m.Release(ctx, id); err != nil {
				t.Errorf("release %s: %v", id, err)
			}
		}
		if err := m.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
		checkClean(t, opt)
		testenv.GoroutinesSettle(t, goroutines)
	})
	return m
}

// leftovers lists what of the Manager named opt.Name is on the node.
func leftovers(opt Options) []string {
	var out []string
	dir := opt.NetnsDir
	if dir == "" {
		dir = DefaultNetnsDir
	}
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), opt.Name+"-") {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, opt.Name) {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst != nil {
			if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && opt.Range.Contains(a) {
				out = append(out, "route "+r.Dst.String())
			}
		}
	}
	if c, err := nftables.New(); err == nil {
		if tab, err := c.ListTableOfFamily(opt.Name, nftables.TableFamilyINet); err == nil && tab != nil {
			out = append(out, "table inet "+opt.Name)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(opt.StateDir, opt.Name)); err == nil {
		for _, e := range ents {
			out = append(out, "state "+e.Name())
		}
	}
	return out
}

// checkClean waits up to 20 s for the kernel to finish removing released
// namespaces, then fails the test on anything left, and removes it.
func checkClean(t testing.TB, opt Options) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var left []string
	for {
		if left = leftovers(opt); len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("left on the node: %q", left)
	forceClean(opt)
}

// forceClean removes everything named after opt.Name.
func forceClean(opt Options) {
	if ents, err := os.ReadDir(DefaultNetnsDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), opt.Name+"-") {
				_ = sys.UnbindNetns(filepath.Join(DefaultNetnsDir, e.Name()))
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, opt.Name) {
			_ = netlink.LinkDel(l)
		}
	}
	if c, err := nftables.New(); err == nil {
		c.DelTable(&nftables.Table{Name: opt.Name, Family: nftables.TableFamilyINet})
		_ = c.Flush()
	}
	_ = os.RemoveAll(filepath.Join(opt.StateDir, opt.Name))
}

// world is the test's network around the node: a namespace standing for
// the internet (and the private networks and metadata service beyond the
// node), routed through an uplink veth, with TCP servers that answer
// "ok <client address>" and a UDP server that records senders.
type world struct {
	t    testing.TB
	inet *os.File
	// hostPort is a TCP port the node itself listens on (all addresses).
	hostPort int

	mu       sync.Mutex
	udpHeard []string // payloads
}

const udpPort = 9999

func newWorld(t testing.TB) *world {
	t.Helper()
	needRoot(t)
	testenv.LockHostNet(t)
	w := &world{t: t}
	var err error
	w.inet, err = sys.NewNetns(func() error {
		h, err := netlink.NewHandle(sys.NetlinkRoute)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}); err != nil {
			return err
		}
		lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}
		for _, a := range inetAddrs {
			if err := h.AddrAdd(lo, &netlink.Addr{IPNet: hostNet(a)}); err != nil {
				return err
			}
		}
		host, err := sys.ProcessNetns()
		if err != nil {
			return err
		}
		defer host.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Flags: net.FlagUp}, PeerName: uplinkName,
			PeerNamespace: netlink.NsFd(int(host.Fd()))}
		if err := h.LinkAdd(veth); err != nil {
			return err
		}
		if err := h.AddrAdd(veth, &netlink.Addr{IPNet: prefixNet(uplinkPeer)}); err != nil {
			return err
		}
		return h.RouteAdd(&netlink.Route{LinkIndex: veth.Index, Gw: net.IP(uplinkHost.Addr().AsSlice())})
	})
	if err != nil {
		t.Fatalf("creating the fake internet: %v", err)
	}
	t.Cleanup(func() {
		w.inet.Close()
		if l, err := netlink.LinkByName(uplinkName); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	up, err := netlink.LinkByName(uplinkName)
	if err != nil {
		t.Fatal(err)
	}
	must(t, netlink.AddrAdd(up, &netlink.Addr{IPNet: prefixNet(uplinkHost)}))
	must(t, netlink.LinkSetUp(up))
	gw := net.IP(uplinkPeer.Addr().AsSlice())
	for _, a := range inetAddrs {
		must(t, netlink.RouteAdd(&netlink.Route{Dst: hostNet(a), Gw: gw}))
	}
	// Servers in the internet.
	must(t, sys.InNetns(w.inet, func() error {
		for _, p := range inetPorts {
			ln, err := net.Listen("tcp4", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			w.serve(ln)
		}
		pc, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", udpPort))
		if err != nil {
			return err
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				w.mu.Lock()
				w.udpHeard = append(w.udpHeard, string(buf[:n]))
				w.mu.Unlock()
			}
		}()
		return nil
	}))
	// A server of the node itself.
	ln, err := net.Listen("tcp4", ":0")
	must(t, err)
	w.hostPort = ln.Addr().(*net.TCPAddr).Port
	w.serve(ln)
	return w
}

// serve answers every connection with "ok <client address>".
func (w *world) serve(ln net.Listener) {
	w.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "ok %s\n", c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
			c.Close()
		}
	}()
}

// heard returns the payloads the internet's UDP server received.
func (w *world) heard() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.udpHeard...)
}

// dial connects to addr:port from inside the namespace at netns (the
// node's when empty) and returns the server's answer.
func dial(netns string, addr netip.Addr, port int) (string, error) {
	var out string
	do := func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(addr, uint16(port)).String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil && err != io.EOF {
			return err
		}
		out = strings.TrimSpace(line)
		return nil
	}
	if netns == "" {
		return out, do()
	}
	return out, EnterNetns(netns, do)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}
}

// testLogger logs to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
