package network

import (
	"context"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestShare: two runtimes share a Manager; each view's Recover keeps the
// other's sandboxes, and the last one sweeps what neither named (while
// a Manager's own Recover with one runtime's list removes the other's).
func TestShare(t *testing.T) {
	newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = -1
	m := newManager(t, opt)
	ctx := context.Background()
	for _, id := range []string{"ct", "vm", "gone"} {
		if _, err := m.Acquire(ctx, id, Policy{Mode: ModeOpen}); err != nil {
			t.Fatal(err)
		}
	}
	views := m.Share(2)
	must(t, views[0].Recover(ctx, []string{"ct"}))
	for _, id := range []string{"ct", "vm", "gone"} {
		if _, ok := m.Endpoint(id); !ok {
			t.Errorf("after the first view's Recover, %s's network is gone", id)
		}
	}
	must(t, views[1].Recover(ctx, []string{"vm"}))
	for id, want := range map[string]bool{"ct": true, "vm": true, "gone": false} {
		if _, ok := m.Endpoint(id); ok != want {
			t.Errorf("after both Recovers, %s has a network: %v, want %v", id, ok, want)
		}
	}
	must(t, views[1].Recover(ctx, nil)) // a second call: nothing
	if _, ok := m.Endpoint("vm"); !ok {
		t.Error("a view's second Recover removed its sandbox's network")
	}
	// The control: the Manager's own Recover with one list.
	must(t, m.Recover(ctx, []string{"ct"}))
	if _, ok := m.Endpoint("vm"); ok {
		t.Error("control: Manager.Recover kept a sandbox it was not told about")
	}
}

// TestReuseRefusesPluggedNamespace: a released namespace with a link or
// an ingress qdisc left (what a microVM's tap adds) is not pooled.
func TestReuseRefusesPluggedNamespace(t *testing.T) {
	newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = 1
	opt.Reuse = true
	m := newManager(t, opt)
	ctx := context.Background()
	waitPool(t, m, opt.PoolSize)
	for _, tc := range []struct {
		name   string
		add    func(h *netlink.Handle) error
		pooled bool
	}{
		{"nothing (the control)", func(h *netlink.Handle) error { return nil }, true},
		{"tap", func(h *netlink.Handle) error {
			return h.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tap0"}, Mode: netlink.TUNTAP_MODE_TAP})
		}, false},
		{"ingress qdisc", func(h *netlink.Handle) error {
			eth0, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			return h.QdiscAdd(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: eth0.Attrs().Index,
				Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}})
		}, false},
	} {
		ep, err := m.Acquire(ctx, "p", Policy{Mode: ModeOpen})
		if err != nil {
			t.Fatal(err)
		}
		must(t, EnterNetns(ep.NetnsPath, func() error {
			h, err := netlink.NewHandle(syscall.NETLINK_ROUTE)
			if err != nil {
				return err
			}
			defer h.Close()
			return tc.add(h)
		}))
		must(t, m.Release(ctx, "p"))
		m.mu.Lock()
		pooled := false
		for _, s := range m.ready {
			pooled = pooled || s.addr == ep.Addr
		}
		m.mu.Unlock()
		if pooled != tc.pooled {
			t.Errorf("%s: the namespace pooled: %v, want %v", tc.name, pooled, tc.pooled)
		}
	}
}
