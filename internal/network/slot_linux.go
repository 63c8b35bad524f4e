package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// EnterNetns runs fn on a locked OS thread that has joined the network
// namespace at path (an Endpoint's NetnsPath) and puts the thread back
// afterwards. Processes forked from fn start in the namespace: the
// runtime starts a sandbox's first process there, with CLONE_NEWUSER but
// without CLONE_NEWNET. Sockets fn opens on its own goroutine belong to
// the namespace; goroutines fn starts run elsewhere. fn must not call
// runtime.UnlockOSThread.
func EnterNetns(path string, fn func() error) error {
	ns, err := sys.OpenNetns(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return sys.InNetns(ns, fn)
}

// build makes a slot: a namespace, its veth pair, addresses, routes,
// neighbours and the anti-spoofing element. An address whose veth name
// or route is still taken (a released sandbox's, not yet cleaned up by
// the kernel) is skipped.
func (m *Manager) build(ctx context.Context) (*slot, error) {
	var errs []error
	for range 8 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m.mu.Lock()
		addr, ok := m.ipam.alloc()
		if !ok {
			m.mu.Unlock()
			return nil, errdefs.New(errdefs.Unavailable, api.CodeNetworkRangeExhausted, "no free address in %s", m.opt.Range)
		}
		s := &slot{addr: addr, hostIf: m.hostIfName(addr)}
		m.owned[s.hostIf] = true
		m.mu.Unlock()
		err := m.setup(s)
		if err == nil {
			return s, nil
		}
		m.mu.Lock()
		m.ipam.free(addr)
		delete(m.owned, s.hostIf)
		m.mu.Unlock()
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("building a sandbox network: %w", errors.Join(errs...))
}

func (m *Manager) setup(s *slot) error {
	ns, err := sys.NewNetns(func() error { return m.setupInside(s) })
	if err != nil {
		return err
	}
	if err := m.setupHost(s); err != nil {
		ns.Close()
		return err
	}
	if err := m.waitOperUp(ns, s); err != nil {
		ns.Close()
		return err
	}
	if err := m.fw.apply([]elem{spoofElem(s.hostIf, s.addr)}, nil); err != nil {
		ns.Close()
		return err
	}
	s.ns = ns
	return nil
}

// setupInside configures a new namespace from a thread inside it, and
// creates the veth pair with its host end directly in the node's
// namespace (moving a link between namespaces costs ~35 ms of RCU waits).
func (m *Manager) setupInside(s *slot) error {
	// Each directory opened once: every namespace's sysctl entries share
	// the dentries of /proc/sys, whose lookups grow with the namespaces.
	dirs := map[string]*os.Root{} // nil: absent (no IPv6)
	defer func() {
		for _, d := range dirs {
			if d != nil {
				d.Close()
			}
		}
	}()
	for _, kv := range SandboxSysctls("0 2147483647") {
		name, key := path.Split(kv[0])
		dir, ok := dirs[name]
		if !ok {
			var err error
			dir, err = os.OpenRoot("/proc/sys/net/" + name)
			if err != nil && !(errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(name, "ipv6")) {
				return err
			}
			dirs[name] = dir
		}
		if dir == nil {
			continue
		}
		if err := sysctlAt(dir, key, kv[1]); err != nil {
			return err
		}
	}
	h, err := netlink.NewHandle(sys.NetlinkRoute)
	if err != nil {
		return fmt.Errorf("opening rtnetlink in a sandbox namespace: %w", err)
	}
	defer h.Close()
	if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1, Name: "lo"}}); err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: sandboxMAC(s.addr), MTU: m.mtu, Flags: net.FlagUp},
		PeerName:  s.hostIf, PeerHardwareAddr: hostMAC,
		PeerNamespace: netlink.NsFd(int(m.host.Fd())),
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth %s: %w", s.hostIf, err)
	}
	if err := h.AddrAdd(veth, &netlink.Addr{IPNet: hostNet(s.addr)}); err != nil {
		return fmt.Errorf("adding address %s: %w", s.addr, err)
	}
	gw := net.IP(m.opt.Gateway.AsSlice())
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: veth.Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: gw, HardwareAddr: hostMAC}); err != nil {
		return fmt.Errorf("adding the gateway neighbour: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: veth.Index, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("adding the default route: %w", err)
	}
	return nil
}

// setupHost configures the host end of s's veth pair.
func (m *Manager) setupHost(s *slot) error {
	link, err := m.nl.LinkByName(s.hostIf)
	if err != nil {
		return fmt.Errorf("host veth %s: %w", s.hostIf, err)
	}
	if m.conf6 != nil {
		if err := sysctlAt(m.conf6, s.hostIf+"/disable_ipv6", "1"); err != nil {
			return err
		}
	}
	if err := sysctlAt(m.conf4, s.hostIf+"/forwarding", "1"); err != nil {
		return err
	}
	if err := m.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", s.hostIf, err)
	}
	idx := link.Attrs().Index
	if err := m.nl.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: net.IP(s.addr.AsSlice()), HardwareAddr: sandboxMAC(s.addr)}); err != nil {
		return fmt.Errorf("adding neighbour %s: %w", s.addr, err)
	}
	if err := m.nl.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: hostNet(s.addr), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("adding route %s: %w", s.addr, err)
	}
	return nil
}

// linkUpWait bounds waitOperUp: the kernel's link watcher runs in a work
// queue under the rtnl lock, which the teardown of other namespaces may
// hold for a while.
const linkUpWait = 10 * time.Second

// waitOperUp returns once both ends of s's veth pair are operationally
// up. Until the kernel's link watcher has seen the carrier come on, a
// veth transmits through the noop qdisc, which drops every packet: a
// sandbox handed out earlier loses its first packets (a TCP SYN costs it
// a second's retransmit), which was seen as a UDP packet that never
// arrived.
func (m *Manager) waitOperUp(ns *os.File, s *slot) error {
	deadline := time.Now().Add(linkUpWait)
	up := func(h *netlink.Handle, name string) error {
		for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
			l, err := h.LinkByName(name)
			if err != nil {
				return fmt.Errorf("link %s: %w", name, err)
			}
			if l.Attrs().OperState == netlink.OperUp {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("link %s still %s after %v", name, l.Attrs().OperState, linkUpWait)
			}
			time.Sleep(pause)
		}
	}
	if err := up(m.nl, s.hostIf); err != nil {
		return err
	}
	return sys.InNetns(ns, func() error {
		h, err := netlink.NewHandle(sys.NetlinkRoute)
		if err != nil {
			return fmt.Errorf("opening rtnetlink in a sandbox namespace: %w", err)
		}
		defer h.Close()
		return up(h, "eth0")
	})
}

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}
}

// discard drops slots that never became (or no longer are) a sandbox's:
// their anti-spoofing elements go, and their namespaces with the last
// file; the kernel removes the veth pairs asynchronously.
func (m *Manager) discard(slots []*slot) {
	if len(slots) == 0 {
		return
	}
	var del []elem
	for _, s := range slots {
		del = append(del, spoofElem(s.hostIf, s.addr))
	}
	if err := m.fw.apply(nil, del); err != nil {
		m.log.Warn("removing pooled network elements", "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range slots {
		if s.ns != nil {
			s.ns.Close()
			s.ns = nil
		}
		m.ipam.free(s.addr)
		delete(m.owned, s.hostIf)
	}
}

// fill keeps the pool at PoolSize until ctx ends. Failed builds are
// logged and retried with a backoff of up to 10 s.
func (m *Manager) fill(ctx context.Context) {
	defer m.pool.Done()
	backoff := 50 * time.Millisecond
	for {
		m.mu.Lock()
		need := !m.closed && len(m.ready) < m.opt.PoolSize
		m.mu.Unlock()
		if !need {
			select {
			case <-ctx.Done():
				return
			case <-m.wake:
			}
			continue
		}
		s, err := m.build(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Error("filling the network pool", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			m.discard([]*slot{s})
			return
		}
		m.ready = append(m.ready, s)
		m.mu.Unlock()
	}
}
