package agentsandbox

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

func TestHostname(t *testing.T) {
	if got := Hostname("sb-1"); got != "sb-1" {
		t.Errorf("Hostname(sb-1) = %q", got)
	}
	long := strings.Repeat("a", 70)
	if got := Hostname(long); got != long[:63] {
		t.Errorf("Hostname(70 bytes) has %d bytes, want 63", len(got))
	}
}

// TestHostsFile: a sandbox without a network (the VM tiers' nil
// endpoint, the container tier's warm sandboxes) has its name on
// 127.0.1.1; one with a network has it on its address, and the names its
// policy allows, sorted, on theirs.
func TestHostsFile(t *testing.T) {
	const head = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	for _, ep := range []*network.Endpoint{nil, {}} {
		if got, want := HostsFile("sb", ep), head+"127.0.1.1\tsb\n"; got != want {
			t.Errorf("HostsFile(%v) = %q, want %q", ep, got, want)
		}
	}
	ep := &network.Endpoint{
		Addr: netip.MustParseAddr("10.88.0.5"),
		Hosts: map[string][]netip.Addr{
			"pypi.org":   {netip.MustParseAddr("151.101.0.223"), netip.MustParseAddr("151.101.64.223")},
			"github.com": {netip.MustParseAddr("140.82.121.4")},
		},
	}
	want := head + "10.88.0.5\tsb\n140.82.121.4\tgithub.com\n151.101.0.223\tpypi.org\n151.101.64.223\tpypi.org\n"
	if got := HostsFile("sb", ep); got != want {
		t.Errorf("HostsFile = %q, want %q", got, want)
	}
}

func TestResolvConf(t *testing.T) {
	const none = "# no resolver: this sandbox has no network egress\n"
	for _, ep := range []*network.Endpoint{nil, {}} {
		if got := ResolvConf(ep); got != none {
			t.Errorf("ResolvConf(%v) = %q", ep, got)
		}
	}
	ep := &network.Endpoint{DNS: []netip.Addr{netip.MustParseAddr("10.88.0.1"), netip.MustParseAddr("1.1.1.1")}}
	want := "nameserver 10.88.0.1\nnameserver 1.1.1.1\noptions timeout:2 attempts:2\n"
	if got := ResolvConf(ep); got != want {
		t.Errorf("ResolvConf = %q, want %q", got, want)
	}
}

// TestEnv: a container's agent has the usual variables alone (the same in
// every sandbox) and gets the sandbox's with each command; a VM's guest
// has both built in. Either way a command sees the same environment.
func TestEnv(t *testing.T) {
	usual := []string{
		"HOME=/root",
		"LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"TERM=xterm",
	}
	if got := BaseEnv(nil); !slices.Equal(got, usual) {
		t.Errorf("BaseEnv(nil) = %q, want %q", got, usual)
	}
	spec := sandbox.Spec{ID: "sb", Env: map[string]string{"FOO": "spec", "BAR": "spec", "HOME": "/home/u"}}
	cmd := CommandEnv(spec, map[string]string{"BAR": "req"})
	if want := map[string]string{"HOSTNAME": "sb", "FOO": "spec", "BAR": "req", "HOME": "/home/u"}; !maps.Equal(cmd, want) {
		t.Errorf("CommandEnv = %v, want %v", cmd, want)
	}
	guest := BaseEnv(CommandEnv(spec, nil))
	want := []string{
		"FOO=spec", "HOME=/home/u", "HOSTNAME=sb", "LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm", "BAR=spec",
	}
	slices.Sort(want)
	if !slices.Equal(guest, want) {
		t.Errorf("a guest's BaseEnv = %q, want %q", guest, want)
	}
	if again := BaseEnv(nil); !slices.Equal(again, usual) {
		t.Errorf("BaseEnv changed its defaults: %q", again)
	}
}
