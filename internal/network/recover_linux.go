package network

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// adopt takes over the sandboxes a previous Manager of the same Name left
// running (the kernel state outlives the process): each one with a record,
// a mounted namespace and a host-side veth. Namespaces without a record
// (an Acquire that never returned) are removed. It returns the set
// elements the adopted sandboxes need.
// Preconditions: called from New only.
func (m *Manager) adopt(ctx context.Context) ([]elem, error) {
	var elems []elem
	entries, err := os.ReadDir(m.stateDir())
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		path := filepath.Join(m.stateDir(), e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
			_ = os.Remove(path) // a write interrupted by a crash
			continue
		}
		r, err := readRecord(path)
		ep, why := m.adoptOne(ctx, r, err)
		if ep == nil {
			m.log.Warn("dropping sandbox network state", "record", e.Name(), "reason", why)
			_ = os.Remove(path)
			continue
		}
		m.eps[ep.id] = ep
		m.owned[ep.hostIf] = true
		elems = append(elems, spoofElem(ep.hostIf, ep.addr))
		elems = append(elems, ep.elems...)
	}
	// Namespaces nobody recorded.
	entries, err = os.ReadDir(m.opt.NetnsDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		id, ok := strings.CutPrefix(e.Name(), m.opt.Name+"-")
		if !ok || m.eps[id] != nil {
			continue
		}
		m.log.Warn("removing an unrecorded sandbox namespace", "netns", e.Name())
		if err := sys.UnbindNetns(filepath.Join(m.opt.NetnsDir, e.Name())); err != nil {
			return nil, err
		}
	}
	return elems, nil
}

// adoptOne checks a record against the kernel and returns the endpoint,
// or nil and the reason it cannot be adopted.
func (m *Manager) adoptOne(ctx context.Context, r record, err error) (*endpoint, string) {
	switch {
	case err != nil:
		return nil, err.Error()
	case checkID(r.ID) != nil:
		return nil, "bad id"
	case r.HostIf != m.hostIfName(r.Addr):
		return nil, "address and veth disagree"
	}
	path := m.netnsPath(r.ID)
	if !sys.IsNetnsMount(path) {
		return nil, "namespace gone"
	}
	if _, err := m.nl.LinkByName(r.HostIf); err != nil {
		_ = sys.UnbindNetns(path)
		return nil, "veth gone"
	}
	if !m.ipam.mark(r.Addr) {
		_ = sys.UnbindNetns(path)
		return nil, "address outside the range or taken"
	}
	c, err := compile(ctx, r.Policy, recorded(r.Hosts), m.resolvers, &m.zones)
	if err != nil {
		// The zones changed in a way the policy no longer fits (say, a
		// name now resolves to a denied range): fail closed.
		m.log.Warn("adopted sandbox policy no longer compiles; denying egress", "id", r.ID, "err", err)
		c, _ = compile(ctx, Policy{}, nil, m.resolvers, &m.zones)
	}
	return &endpoint{id: r.ID, path: path, addr: r.Addr, hostIf: r.HostIf, pol: c, elems: policyElems(r.Addr, c)}, ""
}

// Recover keeps the networks of the sandboxes in live, which New adopted,
// and removes everything else of this Manager's on the node: adopted
// sandboxes not in live, and host-side veths (with their routes) that
// belong to no sandbox. Call it once after New, when the runtime knows
// which sandboxes survived a restart; live names those of them that had
// a network of this Manager (not those without network access, which
// have none here). It returns errdefs.NotFound naming the live sandboxes
// whose networks did not survive.
func (m *Manager) Recover(ctx context.Context, live []string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	var stale []*endpoint
	var missing []string
	for id, ep := range m.eps {
		if ep != nil && !slices.Contains(live, id) {
			stale = append(stale, ep)
			delete(m.eps, id)
		}
	}
	for _, id := range live {
		if _, ok := m.eps[id]; !ok {
			missing = append(missing, id)
		}
	}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()

	var errs []error
	for _, ep := range stale {
		m.log.Info("removing the network of a sandbox that is gone", "id", ep.id)
		errs = append(errs, m.release(ep))
	}
	errs = append(errs, m.sweepLinks(ctx))
	if len(missing) > 0 {
		slices.Sort(missing)
		errs = append(errs, errdefs.New(errdefs.NotFound, api.CodeNetworkNotFound,
			"no network survived for sandboxes %s", strings.Join(missing, ", ")))
	}
	return errors.Join(errs...)
}

// sweepLinks deletes host-side veths of this Manager's form that belong
// to no slot. Most such veths go away by themselves once their namespace
// is gone (the pool of a process that died); those still there after a
// grace period are deleted, which is slow (tens of ms each) but happens
// only when recovering from a crash.
func (m *Manager) sweepLinks(ctx context.Context) error {
	strays := func() ([]netlink.Link, error) {
		links, err := dump(m.nl.LinkList)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		var out []netlink.Link
		for _, l := range links {
			if _, ok := m.parseHostIf(l.Attrs().Name); ok && !m.owned[l.Attrs().Name] {
				out = append(out, l)
			}
		}
		return out, nil
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		links, err := strays()
		if err != nil || len(links) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			var errs []error
			for _, l := range links {
				m.log.Info("deleting a stray sandbox veth", "link", l.Attrs().Name)
				if err := m.nl.LinkDel(l); err != nil && !isNoDevice(err) {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func isNoDevice(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || strings.Contains(err.Error(), "no such device")
}

// dump runs a netlink dump again while the kernel reports it interrupted.
// A dump spans several messages; if the table changes meanwhile (a veth
// of the pool, or of another Manager on the node, comes or goes) the
// kernel flags it NLM_F_DUMP_INTR and the netlink package returns
// ErrDumpInterrupted with results that may be inconsistent. On a node
// whose pool is filling that is common: it made New fail at startup.
func dump[T any](list func() ([]T, error)) ([]T, error) {
	for i := 0; ; i++ {
		out, err := list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == 19 {
			return out, err
		}
	}
}
