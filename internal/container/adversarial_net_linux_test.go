package container

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// outsideHost is a host beyond the node that a sandbox's policy may let
// it reach: a network namespace of its own behind a veth from the node
// (so not one of the node's addresses), serving TCP on addr and counting
// what each connection sends.
type outsideHost struct {
	addr     string
	accepted atomic.Int32
	lines    chan string   // every line received, from any connection
	ended    chan struct{} // one per connection that ended
}

func newOutsideHost(t *testing.T) *outsideHost {
	t.Helper()
	const hostIP, farIP = "198.51.100.1", "198.51.100.2"
	ns, err := sys.NewNetns(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	name := fmt.Sprintf("dso%04x", os.Getpid()&0xffff)
	testenv.HostVeth(t, name, netlink.NsFd(int(ns.Fd())), net.ParseIP(hostIP), 30)
	// Replies come back in through it on their way to the sandbox.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	err = sys.InNetns(ns, func() error {
		peer, err := netlink.LinkByName(name + "p")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(farIP), Mask: net.CIDRMask(30, 32)}}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(peer); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP(hostIP)}); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", farIP+":0")
		return err
	})
	if err != nil {
		t.Fatalf("the outside host: %v", err)
	}
	h := &outsideHost{addr: ln.Addr().String(), lines: make(chan string, 10000), ended: make(chan struct{}, 100)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					h.lines <- sc.Text()
				}
				h.ended <- struct{}{}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return h
}

// testConnectionAcrossPhases is A37: a TCP connection opened while the
// phase allowed the destination does not keep working in a phase that
// does not.
func testConnectionAcrossPhases(t *testing.T, e *isoEnv) {
	ctx := context.Background()
	far := newOutsideHost(t)
	host, port, _ := net.SplitHostPort(far.addr)
	phases := []api.Phase{
		{Name: "coding", Network: &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: host + "/32", Proto: "tcp", Ports: port}}}},
		{Name: "testing"},
	}
	sb := e.create(t, "iso-a37", func(s *sandbox.Spec) { s.Phases = phases })
	talker, err := sb.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{
		Cmd: sh("while :; do echo ping; sleep 0.1; done | nc " + host + " " + port)}})
	if err != nil {
		t.Fatal(err)
	}
	defer talker.Signal("KILL")
	// The control: in coding, the connection carries data.
	for i := 0; i < 3; i++ {
		select {
		case <-far.lines:
		case <-time.After(10 * time.Second):
			t.Fatalf("negative control: the outside host got %d lines from the sandbox in coding", i)
		}
	}
	if err := sb.SetPhase(ctx, phases[1]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-far.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the coding phase's connection still stands 5 s into testing")
	}
	// Nothing more arrives, on it or on a new one.
	for len(far.lines) > 0 {
		// bounded: lines is buffered and non-empty here
		<-far.lines
	}
	before := far.accepted.Load()
	got := probeIn(t, sb, "connect", far.addr)
	if v := got.get(t, far.addr); v == "OK" {
		t.Errorf("a new connection in testing: %v", got)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(far.lines); n != 0 || far.accepted.Load() != before {
		t.Errorf("the outside host heard from the sandbox in testing: %d lines, %d new connections", n, far.accepted.Load()-before)
	}
	// The process that held it was killed by the change, on the record.
	e.auditedWhere(t, sb, "phase-survivor", "denied", "the connection's holder killed", func(ev api.AuditEvent) bool {
		return ev.Kind == "phase-kill" && ev.Phase == "coding" && ev.Comm == "nc"
	})
}
