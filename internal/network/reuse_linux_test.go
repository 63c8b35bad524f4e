package network

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
)

// TestReuse checks Options.Reuse: a released namespace with nothing left
// in it goes back to the pool, and the next sandbox gets it (same address
// and veth) with only its own policy; one with a socket left (a TIME_WAIT
// of a loopback connection, whose addresses the next sandbox would see)
// goes as without Reuse.
func TestReuse(t *testing.T) {
	newWorld(t)
	opt := testOptions(t, t.TempDir())
	opt.PoolSize = 2
	opt.Reuse = true
	m := newManager(t, opt)
	ctx := context.Background()
	waitPool(t, m, opt.PoolSize)

	a, err := m.Acquire(ctx, "a", Policy{Mode: ModeOpen})
	if err != nil {
		t.Fatal(err)
	}
	if n := socketsOf(t, a.NetnsPath); n != 0 {
		t.Fatalf("a fresh namespace holds %d sockets", n)
	}
	if _, err := dial(a.NetnsPath, inetPublic, 80); err != nil {
		t.Fatalf("a (egress open) cannot reach the internet: %v", err)
	}
	must(t, m.Release(ctx, "a"))
	b, err := m.Acquire(ctx, "b", Policy{Mode: ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	if b.Addr != a.Addr || b.HostIf != a.HostIf {
		t.Errorf("b got %s on %s, want a's reused %s on %s", b.Addr, b.HostIf, a.Addr, a.HostIf)
	}
	// No destination a talked to is remembered for b: TCP metrics are
	// never kept in sandbox namespaces (the host keeps them).
	var nsVal string
	must(t, EnterNetns(b.NetnsPath, func() error {
		v, err := os.ReadFile("/proc/sys/net/ipv4/tcp_no_metrics_save")
		nsVal = strings.TrimSpace(string(v))
		return err
	}))
	hostVal, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_no_metrics_save")
	if nsVal != "1" || strings.TrimSpace(string(hostVal)) != "0" {
		t.Errorf("tcp_no_metrics_save: %q in the sandbox's namespace, %q on the host; want 1 and 0", nsVal, hostVal)
	}
	// Only b's policy applies: a's open egress went with a.
	if _, err := dial(b.NetnsPath, inetPublic, 80); err == nil {
		t.Errorf("b (egress none) reached out through a's open policy")
	}

	// A loopback connection closed from the client side leaves a
	// TIME_WAIT socket in the namespace.
	must(t, EnterNetns(b.NetnsPath, func() error {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return err
		}
		s, err := ln.Accept()
		if err != nil {
			return err
		}
		c.Close()
		s.Close()
		return nil
	}))
	if n := socketsOf(t, b.NetnsPath); n == 0 {
		t.Fatal("no socket left after a loopback connection: the check cannot fail")
	}
	must(t, m.Release(ctx, "b"))
	c, err := m.Acquire(ctx, "c", Policy{Mode: ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	if c.HostIf == b.HostIf {
		t.Errorf("c got b's namespace, which held a socket")
	}
	must(t, m.Release(ctx, "c"))
	must(t, m.Close(ctx))
	checkClean(t, opt)
}

func socketsOf(t *testing.T, path string) int {
	t.Helper()
	var n int
	must(t, EnterNetns(path, func() error {
		var err error
		n, err = socketsHere()
		return err
	}))
	return n
}

func TestSockstatCount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"sockets: used 5\nTCP: inuse 0 orphan 3 tw 0 alloc 9 mem 72\nUDP: inuse 0 mem 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n", 0},
		{"sockets: used 5\nTCP: inuse 1 orphan 3 tw 2 alloc 9 mem 72\nUDP: inuse 1 mem 4\nRAW: inuse 0\nFRAG: inuse 1 memory 1024\n", 5},
		{"TCP6: inuse 2\nUDP6: inuse 0\n", 2},
	} {
		if got, err := sockstatCount(c.in); err != nil || got != c.want {
			t.Errorf("sockstatCount(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	if _, err := sockstatCount("TCP: inuse x"); err == nil {
		t.Error("a count that is not a number parsed")
	}
}
