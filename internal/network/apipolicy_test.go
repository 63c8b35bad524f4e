package network

import (
	"net/netip"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func TestFromAPI(t *testing.T) {
	p, err := FromAPI(nil)
	if err != nil || p.Mode != ModeNone || len(p.Allow) != 0 {
		t.Fatalf("nil policy = %+v, %v; want none", p, err)
	}
	p, err = FromAPI(&api.NetworkPolicy{Egress: "allowlist", Allow: []api.NetworkRule{
		{CIDR: "10.1.2.0/24", Proto: "tcp", Ports: "8000-8100"},
		{CIDR: "192.0.2.7"},
		{Host: "example.org", Proto: "udp", Ports: "53"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Prefix: netip.MustParsePrefix("10.1.2.0/24"), Proto: ProtoTCP, Ports: PortRange{8000, 8100}},
		{Prefix: netip.MustParsePrefix("192.0.2.7/32")},
		{Host: "example.org", Proto: ProtoUDP, Ports: PortRange{53, 53}},
	}
	if p.Mode != ModeAllowlist || len(p.Allow) != len(want) {
		t.Fatalf("got %+v", p)
	}
	for i := range want {
		if p.Allow[i] != want[i] {
			t.Errorf("rule %d = %+v, want %+v", i, p.Allow[i], want[i])
		}
	}
	for _, bad := range []api.NetworkPolicy{
		{Egress: "everything"},
		{Allow: []api.NetworkRule{{}}},
		{Allow: []api.NetworkRule{{CIDR: "10.0.0.0/8", Host: "x"}}},
		{Allow: []api.NetworkRule{{CIDR: "not-an-address"}}},
		{Allow: []api.NetworkRule{{CIDR: "2001:db8::/32"}}},
		{Allow: []api.NetworkRule{{CIDR: "10.0.0.0/8", Proto: "icmp"}}},
		{Allow: []api.NetworkRule{{CIDR: "10.0.0.0/8", Ports: "80"}}},
		{Allow: []api.NetworkRule{{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "90-80"}}},
		{Allow: []api.NetworkRule{{CIDR: "10.0.0.0/8", Proto: "tcp", Ports: "0"}}},
	} {
		_, err := FromAPI(&bad)
		if errdefs.CodeOf(err) != "invalid_network_policy" {
			t.Errorf("FromAPI(%+v) = %v; want invalid_network_policy", bad, err)
		}
	}
}
