package network

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

type mapResolver map[string][]netip.Addr

func (r mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, errdefs.New(errdefs.NotFound, "x", "no such host")
}

func testZones() *zones {
	z := &zones{}
	for _, p := range append(neverPrefixes, netip.MustParsePrefix("10.88.0.0/16")) {
		z.never = append(z.never, prefixRange(p))
	}
	for _, p := range privatePrefixes {
		z.private = append(z.private, prefixRange(p))
	}
	return z
}

func addr(s string) uint32 { return u32(netip.MustParseAddr(s)) }

func TestCompileReaches(t *testing.T) {
	z := testZones()
	res := mapResolver{"api.example": {netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::1")}}
	resolvers := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("127.0.0.53")}
	type probe struct {
		dst   string
		proto uint8
		port  uint16
		want  bool
	}
	for _, tc := range []struct {
		name    string
		p       Policy
		probes  []probe
		wantDNS []netip.Addr
	}{
		{"none", Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0")}}}, []probe{
			{"8.8.8.8", ipprotoTCP, 443, false},
			{"10.0.0.2", ipprotoUDP, 53, false},
		}, nil},
		{"open", Policy{Mode: ModeOpen}, []probe{
			{"8.8.8.8", ipprotoTCP, 443, true},
			{"10.0.0.2", ipprotoUDP, 53, true}, // the node's resolver
			{"10.0.0.2", ipprotoTCP, 53, true},
			{"10.0.0.2", ipprotoTCP, 80, false},
			{"10.0.0.3", ipprotoUDP, 53, false},
			{"192.168.1.1", ipprotoTCP, 80, false},
			{"100.64.1.1", ipprotoTCP, 80, false},
			{"169.254.169.254", ipprotoTCP, 80, false},
			{"10.88.0.5", ipprotoTCP, 80, false},
			{"127.0.0.53", ipprotoUDP, 53, false},
		}, []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
		{"open with a private exception", Policy{Mode: ModeOpen, Allow: []Rule{{Prefix: netip.MustParsePrefix("192.168.1.0/24"), Proto: ProtoTCP, Ports: PortRange{80, 80}}}}, []probe{
			{"192.168.1.1", ipprotoTCP, 80, true},
			{"192.168.1.1", ipprotoTCP, 81, false},
			{"192.168.2.1", ipprotoTCP, 80, false},
		}, []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
		{"allowlist", Policy{Mode: ModeAllowlist, Allow: []Rule{
			{Host: "api.example", Proto: ProtoTCP, Ports: PortRange{443, 443}},
			{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Proto: ProtoUDP, Ports: PortRange{53, 53}},
			{Prefix: netip.MustParsePrefix("10.88.0.0/16")},
			{Prefix: netip.MustParsePrefix("::ffff:198.51.100.0/120")},
		}}, []probe{
			{"203.0.113.7", ipprotoTCP, 443, true},
			{"203.0.113.7", ipprotoTCP, 80, false},
			{"203.0.113.8", ipprotoTCP, 443, false},
			{"10.1.2.3", ipprotoUDP, 53, true},
			{"10.1.2.3", ipprotoTCP, 53, false},
			{"10.88.0.7", ipprotoTCP, 80, false}, // never, even listed
			{"198.51.100.9", ipprotoICMP, 0, true},
			{"8.8.8.8", ipprotoTCP, 443, false},
		}, []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := compile(context.Background(), tc.p, res, resolvers, z)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.probes {
				if got := c.reaches(z, addr(p.dst), p.proto, p.port); got != p.want {
					t.Errorf("reaches(%s, %d, %d) = %v, want %v", p.dst, p.proto, p.port, got, p.want)
				}
			}
			if diff := cmp.Diff(tc.wantDNS, c.dns, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("dns (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCompileRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
	}{
		{"unknown mode", Policy{Mode: "wide"}},
		{"prefix and host", Policy{Mode: ModeAllowlist, Allow: []Rule{{Host: "a", Prefix: netip.MustParsePrefix("1.0.0.0/8")}}}},
		{"empty rule", Policy{Mode: ModeAllowlist, Allow: []Rule{{}}}},
		{"ports without protocol", Policy{Mode: ModeAllowlist, Allow: []Rule{{Prefix: netip.MustParsePrefix("1.0.0.0/8"), Ports: PortRange{1, 2}}}}},
		{"reversed ports", Policy{Mode: ModeAllowlist, Allow: []Rule{{Prefix: netip.MustParsePrefix("1.0.0.0/8"), Proto: ProtoTCP, Ports: PortRange{9, 2}}}}},
		{"unknown protocol", Policy{Mode: ModeAllowlist, Allow: []Rule{{Prefix: netip.MustParsePrefix("1.0.0.0/8"), Proto: "sctp"}}}},
		{"ipv6", Policy{Mode: ModeAllowlist, Allow: []Rule{{Prefix: netip.MustParsePrefix("2001:db8::/32")}}}},
		{"unresolvable", Policy{Mode: ModeAllowlist, Allow: []Rule{{Host: "nope.example"}}}},
		{"ipv6-only host", Policy{Mode: ModeAllowlist, Allow: []Rule{{Host: "v6.example"}}}},
		{"inbound port 0", Policy{Inbound: []Port{{ProtoTCP, 0}}}},
		{"inbound protocol", Policy{Inbound: []Port{{ProtoAny, 80}}}},
		{"too many rules", Policy{Mode: ModeAllowlist, Allow: make([]Rule, maxRules+1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compile(context.Background(), tc.p, mapResolver{"v6.example": {netip.MustParseAddr("2001:db8::1")}}, nil, testZones())
			if errdefs.ClassOf(err) != errdefs.Invalid {
				t.Errorf("compile: %v, want an Invalid error", err)
			}
		})
	}
}

// TestDisjointL4 checks on a small space that the disjoint rectangles
// cover exactly the points of the input ones, and that none overlap.
func TestDisjointL4(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		var in []l4Range
		for range 1 + rng.IntN(6) {
			a, b := rng.Uint32N(16), rng.Uint32N(16)
			p, q := uint16(rng.IntN(16)), uint16(rng.IntN(16))
			in = append(in, l4Range{[]uint8{ipprotoTCP, ipprotoUDP}[rng.IntN(2)],
				addrRange{min(a, b), max(a, b)}, PortRange{min(p, q), max(p, q)}})
		}
		out := disjointL4(in)
		covers := func(rs []l4Range, proto uint8, a uint32, p uint16) int {
			n := 0
			for _, r := range rs {
				if r.proto == proto && r.addr.contains(a) && r.ports.First <= p && p <= r.ports.Last {
					n++
				}
			}
			return n
		}
		for _, proto := range []uint8{ipprotoTCP, ipprotoUDP} {
			for a := range uint32(16) {
				for p := range uint16(16) {
					want, got := covers(in, proto, a, p) > 0, covers(out, proto, a, p)
					if got > 1 || want != (got == 1) {
						t.Fatalf("point %d/%d/%d: covered %d times by %v, want %v (input %v)", proto, a, p, got, out, want, in)
					}
				}
			}
		}
	}
}

func TestIPAM(t *testing.T) {
	a, err := newIPAM(netip.MustParsePrefix("10.0.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		x, ok := a.alloc()
		if !ok {
			break
		}
		got = append(got, x.String())
	}
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("alloc (-want +got):\n%s", diff)
	}
	a.free(netip.MustParseAddr("10.0.0.2"))
	a.free(netip.MustParseAddr("10.0.0.5"))
	// Round-robin from the cursor (which the failed alloc moved to .3).
	if x, _ := a.alloc(); x.String() != "10.0.0.5" {
		t.Errorf("alloc = %s, want 10.0.0.5", x)
	}
	if x, _ := a.alloc(); x.String() != "10.0.0.2" {
		t.Errorf("alloc = %s, want 10.0.0.2", x)
	}
	a.free(netip.MustParseAddr("10.0.0.2"))
	if !a.mark(netip.MustParseAddr("10.0.0.2")) || a.mark(netip.MustParseAddr("10.0.0.2")) {
		t.Error("mark of a free address must succeed once")
	}
	if a.mark(netip.MustParseAddr("10.0.1.1")) {
		t.Error("mark outside the range succeeded")
	}
	if _, ok := a.alloc(); ok || a.n != 6 {
		t.Errorf("range should be full with 6 in use, have %d", a.n)
	}
	if _, err := newIPAM(netip.MustParsePrefix("10.0.0.0/31")); err == nil {
		t.Error("a /31 range was accepted")
	}
}

func TestCheckID(t *testing.T) {
	for id, ok := range map[string]bool{"abc": true, "sbx_01.a-b": true, "": false, ".x": false, "a/b": false, "a b": false} {
		if (checkID(id) == nil) != ok {
			t.Errorf("checkID(%q) = %v, want ok=%v", id, checkID(id), ok)
		}
	}
}
