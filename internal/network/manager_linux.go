package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cleanup"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Manager creates, tracks and removes the networks of a node's sandboxes.
// It is safe for concurrent use.
type Manager struct {
	opt       Options // normalised; read-only after New
	log       *slog.Logger
	lock      *os.File        // <StateDir>/<Name>.lock, flocked: one Manager per name
	host      *os.File        // the node's network namespace
	nl        *netlink.Handle // rtnetlink in the node's namespace
	conf4     *os.Root        // /proc/sys/net/ipv4/conf of the node
	conf6     *os.Root        // /proc/sys/net/ipv6/conf of the node; nil without IPv6
	fw        *firewall
	zones     zones
	layout    layout
	resolvers []netip.Addr
	mtu       int

	stopPool context.CancelFunc
	wake     chan struct{} // asks the pool to refill
	pool     sync.WaitGroup
	ops      sync.WaitGroup // calls in progress; Close waits for them

	// mu guards the following fields.
	mu     sync.Mutex
	closed bool
	ipam   *ipam
	eps    map[string]*endpoint // live sandboxes; nil while an Acquire runs
	ready  []*slot              // the pool
	owned  map[string]bool      // host-side veths of ready, building and live slots
}

// slot is a namespace with its veth pair configured.
type slot struct {
	ns     *os.File // held while pooled; nil once bind-mounted
	addr   netip.Addr
	hostIf string
}

// endpoint is a live sandbox's network.
type endpoint struct {
	id, path string
	addr     netip.Addr
	hostIf   string

	// mu guards the following fields.
	mu    sync.Mutex
	pol   *compiled
	elems []elem // the policy's set elements (the spoof element aside)
	gone  bool   // released
}

var errClosed = errdefs.New(errdefs.Unavailable, api.CodeNetworkClosed, "network manager is closed")

// New prepares the node (the netns directory, IPv4 forwarding on the
// uplinks, the nftables table), adopts the sandboxes a previous Manager
// with the same Name left (see Recover) and starts filling the pool.
func New(ctx context.Context, opt Options) (*Manager, error) {
	opt, err := normalise(opt)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		opt:   opt,
		log:   opt.Logger,
		wake:  make(chan struct{}, 1),
		eps:   map[string]*endpoint{},
		owned: map[string]bool{},
	}
	if m.ipam, err = newIPAM(opt.Range); err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, api.CodeInvalidNetworkOptions, err, "network options")
	}
	var cu cleanup.Stack
	defer cu.Clean()
	if err := sys.EnsureNetnsDir(opt.NetnsDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(m.stateDir(), 0o700); err != nil {
		return nil, err
	}
	if m.lock, err = os.OpenFile(m.stateDir()+".lock", os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, err
	}
	cu.Add(func() { m.lock.Close() })
	if err := sys.TryLock(m.lock); errors.Is(err, sys.ErrLocked) {
		return nil, errdefs.Wrap(errdefs.Conflict, api.CodeNetworkManagerRunning, err, "another network manager named %s runs on this node", opt.Name)
	} else if err != nil {
		return nil, err
	}
	if m.host, err = sys.ProcessNetns(); err != nil {
		return nil, err
	}
	cu.Add(func() { m.host.Close() })
	if m.nl, err = netlink.NewHandle(sys.NetlinkRoute); err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	cu.Add(m.nl.Close)
	if m.conf4, m.conf6, err = openSysctlDirs(); err != nil {
		return nil, err
	}
	cu.Add(func() {
		m.conf4.Close()
		if m.conf6 != nil {
			m.conf6.Close()
		}
	})
	if err := m.probeHost(); err != nil {
		return nil, err
	}
	if m.fw, err = newFirewall(opt.Name); err != nil {
		return nil, err
	}
	cu.Add(func() { _ = m.fw.close() })
	elems, err := m.adopt(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.fw.install(m.layout, elems); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.stopPool = cancel
	if opt.PoolSize > 0 {
		m.pool.Add(1)
		go m.fill(pctx)
	}
	cu.Release()
	return m, nil
}

// Acquire gives sandbox id a network with policy p: a namespace from the
// pool (or a new one if the pool is empty) bind-mounted at
// <NetnsDir>/<Name>-<id>. It returns errdefs.Conflict if id has one,
// errdefs.Invalid for a bad policy, errdefs.Unavailable when the range
// is exhausted or the Manager closed.
func (m *Manager) Acquire(ctx context.Context, id string, p Policy) (*Endpoint, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	c, err := compile(ctx, p, m.opt.Resolver, m.resolvers, &m.zones)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errClosed
	}
	if _, ok := m.eps[id]; ok {
		m.mu.Unlock()
		return nil, errdefs.New(errdefs.Conflict, api.CodeNetworkExists, "sandbox %s already has a network", id)
	}
	m.eps[id] = nil
	var s *slot
	if n := len(m.ready); n > 0 {
		s, m.ready = m.ready[n-1], m.ready[:n-1]
	}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	// Refill once this call is done, not while it runs: on few cores a
	// concurrent build slows it down several times.
	defer m.kick()

	var cu cleanup.Stack
	defer cu.Clean()
	cu.Add(func() {
		m.mu.Lock()
		delete(m.eps, id)
		m.mu.Unlock()
	})
	if s == nil {
		if s, err = m.build(ctx); err != nil {
			return nil, err
		}
	}
	cu.Add(func() { m.discard([]*slot{s}) })
	ep := &endpoint{id: id, path: m.netnsPath(id), addr: s.addr, hostIf: s.hostIf, pol: c}
	if err := sys.BindNetns(s.ns, ep.path); err != nil {
		return nil, err
	}
	cu.Add(func() { _ = sys.UnbindNetns(ep.path) })
	ep.elems = policyElems(ep.addr, c)
	if err := m.fw.apply(ep.elems, nil); err != nil {
		return nil, err
	}
	cu.Add(func() { _ = m.fw.apply(nil, ep.elems) })
	if err := writeRecord(m.recordPath(id), ep.record()); err != nil {
		return nil, err
	}
	s.ns.Close()
	s.ns = nil
	m.mu.Lock()
	m.eps[id] = ep
	m.mu.Unlock()
	cu.Release()
	return ep.view(m.opt.Gateway), nil
}

// Release removes sandbox id's network: its nftables elements at once,
// its namespace (and with it the veth pair and routes) as soon as no
// process of the sandbox is left in it; the kernel does that part
// asynchronously. Releasing an unknown id does nothing.
func (m *Manager) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	ep, ok := m.eps[id]
	if ok && ep == nil {
		m.mu.Unlock()
		return errdefs.New(errdefs.Conflict, api.CodeNetworkBusy, "sandbox %s's network is being created", id)
	}
	if !ok {
		m.mu.Unlock()
		return nil
	}
	delete(m.eps, id)
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	return m.release(ep)
}

func (m *Manager) release(ep *endpoint) error {
	reuse := m.reusable(ep)
	ep.mu.Lock()
	ep.gone = true
	del := ep.elems
	if reuse == nil {
		del = slices.Concat(del, []elem{spoofElem(ep.hostIf, ep.addr)})
	}
	ep.mu.Unlock()
	var errs []error
	if err := m.fw.apply(nil, del); err != nil {
		// One missing element fails the batch: retry one by one so the
		// others still go.
		for _, e := range del {
			_ = m.fw.apply(nil, []elem{e})
		}
		m.log.Warn("removing sandbox firewall elements", "id", ep.id, "err", err)
	}
	if err := sys.UnbindNetns(ep.path); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(m.recordPath(ep.id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	m.mu.Lock()
	if reuse != nil && !m.closed && len(m.ready) < 2*m.opt.PoolSize {
		m.ready = append(m.ready, &slot{ns: reuse, addr: ep.addr, hostIf: ep.hostIf})
		m.mu.Unlock()
		return errors.Join(errs...)
	}
	m.mu.Unlock()
	if reuse != nil {
		// Not taken after all: its anti-spoofing element goes too.
		reuse.Close()
		if err := m.fw.apply(nil, []elem{spoofElem(ep.hostIf, ep.addr)}); err != nil {
			m.log.Warn("removing sandbox firewall elements", "id", ep.id, "err", err)
		}
	}
	m.mu.Lock()
	m.ipam.free(ep.addr)
	delete(m.owned, ep.hostIf)
	m.mu.Unlock()
	return errors.Join(errs...)
}

// reusable returns sandbox ep's namespace, open, if Options.Reuse is on
// and no IP socket is left in it (see socketsIn): the caller returns it
// to the pool. Otherwise, and on any error, nil.
func (m *Manager) reusable(ep *endpoint) *os.File {
	if !m.opt.Reuse || m.opt.PoolSize <= 0 {
		return nil
	}
	ns, err := sys.OpenNetns(ep.path)
	if err != nil {
		return nil
	}
	n := 0
	err = sys.InNetns(ns, func() error {
		var err error
		if n, err = socketsHere(); err != nil || n > 0 {
			return err
		}
		// A runtime may have added links or tc filters (a microVM's tap
		// and its redirects); a slot with any of them left is not clean.
		if dirty, err := linksChanged(); err != nil || dirty {
			n = 1
			return err
		}
		// Cached routes carry what the namespace learnt of destinations
		// (path MTUs): they go.
		return os.WriteFile("/proc/sys/net/ipv4/route/flush", []byte("1"), 0)
	})
	if err != nil || n > 0 {
		ns.Close()
		return nil
	}
	return ns
}

// linksChanged reports whether the calling thread's network namespace
// holds more than its loopback and eth0, or eth0 has an ingress or clsact
// qdisc: what a microVM's tap adds (see microvm's net_linux.go).
func linksChanged() (bool, error) {
	h, err := netlink.NewHandle(sys.NetlinkRoute)
	if err != nil {
		return false, err
	}
	defer h.Close()
	links, err := dump(h.LinkList)
	if err != nil {
		return false, err
	}
	if len(links) != 2 {
		return true, nil
	}
	for _, l := range links {
		if l.Attrs().Name != "eth0" {
			continue
		}
		qs, err := h.QdiscList(l)
		if err != nil {
			return false, err
		}
		for _, q := range qs {
			if p := q.Attrs().Parent; p == netlink.HANDLE_INGRESS || p == netlink.HANDLE_CLSACT {
				return true, nil
			}
		}
	}
	return false, nil
}

// socketsHere counts the IP sockets left in the calling thread's network
// namespace (open or closing, TCP's TIME_WAITs too, whose addresses the
// next sandbox would see) and its IP fragments, from the namespace's own
// counters in /proc/net/sockstat (a listing such as /proc/net/tcp walks
// every namespace's sockets: ~9 ms a release here).
func socketsHere() (int, error) {
	n := 0
	for _, f := range []string{"sockstat", "sockstat6"} {
		b, err := os.ReadFile("/proc/thread-self/net/" + f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		c, err := sockstatCount(string(b))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
		n += c
	}
	return n, nil
}

// sockstatCount sums a sockstat file's counts of the namespace's IP
// sockets: every protocol's inuse and tw. TCP's orphan, alloc and mem
// are the whole host's (an orphan still hashed counts in inuse).
// "sockets: used" is left out: it counts unix, netlink and packet
// sockets too, which go with the last process holding them (the node's
// own setup sockets among them, freed after an RCU grace period).
func sockstatCount(s string) (int, error) {
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		for i := 1; i+1 < len(f); i += 2 {
			switch f[i] {
			case "inuse", "tw":
				v, err := strconv.Atoi(f[i+1])
				if err != nil {
					return 0, fmt.Errorf("parsing %q: %w", line, err)
				}
				n += v
			}
		}
	}
	return n, nil
}

// SetPolicy replaces sandbox id's policy; the next packet sees the new
// one, also on connections opened under the old. It returns
// errdefs.NotFound for an unknown id and errdefs.Invalid for a bad
// policy.
func (m *Manager) SetPolicy(ctx context.Context, id string, p Policy) error {
	c, err := compile(ctx, p, m.opt.Resolver, m.resolvers, &m.zones)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	ep := m.eps[id]
	if ep == nil {
		m.mu.Unlock()
		return errdefs.New(errdefs.NotFound, api.CodeNetworkNotFound, "sandbox %s has no network", id)
	}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()

	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.gone {
		return errdefs.New(errdefs.NotFound, api.CodeNetworkNotFound, "sandbox %s has no network", id)
	}
	next := policyElems(ep.addr, c)
	add, del := diffElems(ep.elems, next)
	if err := m.fw.apply(add, del); err != nil {
		return err
	}
	prev := ep.pol
	ep.pol, ep.elems = c, next
	if err := writeRecord(m.recordPath(id), ep.recordLocked()); err != nil {
		// The kernel has the new policy; only a restart would bring back
		// the old one from the record.
		m.log.Warn("recording sandbox policy", "id", id, "err", err, "previous_mode", prev.policy.Mode)
	}
	return nil
}

// Endpoint returns sandbox id's network as Acquire did, with the DNS
// servers and hosts of its current policy.
func (m *Manager) Endpoint(id string) (*Endpoint, bool) {
	m.mu.Lock()
	ep := m.eps[id]
	m.mu.Unlock()
	if ep == nil {
		return nil, false
	}
	return ep.view(m.opt.Gateway), true
}

// Stats are counts for metrics and tests.
type Stats struct {
	Live   int // sandboxes with a network
	Pooled int // ready namespaces
}

// Stats returns the current counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, ep := range m.eps {
		if ep != nil {
			n++
		}
	}
	return Stats{Live: n, Pooled: len(m.ready)}
}

// Close stops the pool and removes its namespaces; live sandboxes keep
// their networks and enforcement (a new Manager adopts them). With no
// live sandbox left it also removes the nftables table. Calls made after
// Close return errdefs.Unavailable.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	m.stopPool()
	m.pool.Wait()
	m.ops.Wait()

	m.mu.Lock()
	ready := m.ready
	m.ready = nil
	live := len(m.eps)
	m.mu.Unlock()
	m.discard(ready)
	var errs []error
	if live == 0 {
		errs = append(errs, m.fw.remove())
	}
	errs = append(errs, m.fw.close())
	m.nl.Close()
	m.conf4.Close()
	if m.conf6 != nil {
		m.conf6.Close()
	}
	errs = append(errs, m.host.Close())
	m.lock.Close() // last: the next Manager may start now
	return errors.Join(errs...)
}

// kick asks the pool to refill.
func (m *Manager) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *Manager) netnsPath(id string) string {
	return filepath.Join(m.opt.NetnsDir, m.opt.Name+"-"+id)
}

func (m *Manager) stateDir() string { return filepath.Join(m.opt.StateDir, m.opt.Name) }

func (m *Manager) recordPath(id string) string { return filepath.Join(m.stateDir(), id+".json") }

func (ep *endpoint) record() record {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.recordLocked()
}

// Preconditions: ep.mu must be held.
func (ep *endpoint) recordLocked() record {
	return record{ID: ep.id, Addr: ep.addr, HostIf: ep.hostIf, Policy: ep.pol.policy, Hosts: ep.pol.hosts}
}

func (ep *endpoint) view(gw netip.Addr) *Endpoint {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	e := &Endpoint{ID: ep.id, NetnsPath: ep.path, Addr: ep.addr, Gateway: gw, HostIf: ep.hostIf,
		MAC: sandboxMAC(ep.addr), GatewayMAC: slices.Clone(hostMAC)}
	if ep.pol != nil {
		e.DNS = append([]netip.Addr(nil), ep.pol.dns...)
		if len(ep.pol.hosts) > 0 {
			e.Hosts = maps.Clone(ep.pol.hosts)
		}
	}
	return e
}
