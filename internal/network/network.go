// Package network gives every container sandbox a network namespace of its
// own, connected to the node by a routed veth pair, with default-deny
// egress enforced by nftables in the node's namespace, where the sandbox
// cannot reach it.
//
// # Model
//
// The node (this package, running as root in the initial user namespace)
// creates each namespace, so the namespace is owned by the initial user
// namespace: a sandbox whose processes run in a user namespace of their
// own has no CAP_NET_ADMIN or CAP_NET_RAW over it and cannot change its
// addresses, routes, neighbours, sysctls or in-namespace rules, nor open
// raw or packet sockets. Inside each namespace:
//
//   - eth0 carries the sandbox address as a /32; the default route points
//     at a link-local gateway (169.254.1.1) whose MAC is a permanent
//     neighbour entry, so no ARP is needed in either direction;
//   - IPv6 is disabled (net.ipv6.conf.{all,default}.disable_ipv6=1);
//   - net.ipv4.ip_unprivileged_port_start=0, so servers in the sandbox
//     can bind ports below 1024 without CAP_NET_BIND_SERVICE, and
//     net.ipv4.ping_group_range="0 2147483647", so ping(8) works through
//     ICMP datagram sockets without CAP_NET_RAW (both as Docker does).
//
// On the node each sandbox has a host-side veth named <Name><8 hex digits
// of the address> (dsec0a580002 for 10.88.0.2) with no address, a /32
// route to the sandbox and a permanent neighbour entry: routed, like
// Calico, with no bridge and so no 1,024-port limit.
//
// # Enforcement
//
// One nftables table, inet <Name> ("inet dsec"), holds every rule;
// sandboxes are set elements, so creating or changing one is a few
// element updates, never a ruleset rebuild. Packets from a sandbox must
// carry its address (anti-spoofing, before conntrack); IPv6 from or to a
// sandbox is dropped. What a sandbox may reach:
//
//   - never: the sandbox range (other sandboxes), the node's own
//     addresses (everything the node terminates, including 127.0.0.0/8
//     through the gateway), 0.0.0.0/8, 169.254.0.0/16 (link-local and
//     cloud metadata), multicast, 240.0.0.0/4 and broadcast, and
//     Options.Deny (the control plane);
//   - private unless an Allow rule names them: 10/8, 172.16/12,
//     192.168/16, 100.64/10 (CGNAT), 192.0.0.0/24, 198.18.0.0/15 and the
//     node's directly connected subnets;
//   - the rest according to the Policy: ModeNone (the default) nothing,
//     ModeAllowlist exactly the Allow rules, ModeOpen everything public
//     plus the Allow rules.
//
// Allowed egress is masqueraded behind the node's uplinks. Connections
// to a sandbox are refused except from the node to the ports listed in
// Policy.Inbound. Policy changes apply to the next packet, including on
// connections that are already open.
//
// The container and microvm tiers share one Manager (a microVM's tap is
// plugged into its sandbox's namespace: see internal/vm/vmtier); each gets
// a Shared view, whose Recover keeps the other tier's networks.
//
// DNS names in Allow rules are resolved by the node when the policy is
// set and the addresses recorded; a name whose addresses change later
// keeps the old ones until the next SetPolicy (DNS rebinding is out of
// scope). RATIONALE.md has the measurements behind these choices.
package network

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Defaults of Options.
var (
	DefaultRange   = netip.MustParsePrefix("10.88.0.0/16")
	DefaultGateway = netip.MustParseAddr("169.254.1.1")
)

const (
	// DefaultName names the nftables table, the netns files
	// (/run/netns/<Name>-<id>) and the host-side veths (<Name><hex>).
	DefaultName = "dsec"
	// DefaultPoolSize is how many ready namespaces the pool keeps.
	DefaultPoolSize = 32
	// DefaultNetnsDir is where namespaces are bind-mounted, as iproute2
	// does, so `ip netns list` shows them.
	DefaultNetnsDir = "/run/netns"
	// DefaultStateDir holds one small record per live sandbox, read back
	// by New after a restart.
	DefaultStateDir = "/run/dsec/network"
)

// Options configure a Manager. The zero value is valid: every field has a
// default.
type Options struct {
	// Range is the IPv4 range sandbox addresses come from (default
	// 10.88.0.0/16). It must not overlap the node's networks.
	Range netip.Prefix
	// PoolSize is how many ready namespaces are kept (default 32; a
	// negative value disables the pool).
	PoolSize int
	// Reuse returns a released sandbox's namespace, veth pair and address
	// to the pool instead of destroying them, when no IP socket of the
	// sandbox is left in the namespace, TIME_WAITs included (else it goes
	// as usual; other sockets go with the last process); the pool
	// then holds up to twice PoolSize. Building a namespace and its veth
	// pair, and the kernel's teardown of one, cost ~3 ms of CPU each
	// sandbox, a fifth of a create-to-destroy cycle. Cached routes are
	// flushed and TCP metrics never kept (tcp_no_metrics_save), so no
	// destination carries over; what does is what nobody can reset: the
	// interface's and the namespace's traffic counters (ip -s link,
	// /proc/net/snmp), so a sandbox can learn how much its predecessors
	// on the slot sent, or leave its successors a message there (a
	// covert channel between sandboxes). Off by default.
	Reuse bool
	// Logger receives background errors (pool refills, async cleanup).
	Logger *slog.Logger
	// HostIfaces are the uplinks allowed egress is masqueraded out of
	// (and on which IPv4 forwarding is enabled). Default: the interfaces
	// of the node's IPv4 default routes at New.
	HostIfaces []string
	// DNS are the resolvers offered to sandboxes (default: the IPv4
	// nameservers of the node's /etc/resolv.conf). Under ModeOpen a
	// sandbox may reach them on port 53 even when they are private; under
	// ModeAllowlist only if an Allow rule covers udp/53. Resolvers on the
	// node itself (127.0.0.53) are never reachable.
	DNS []netip.Addr
	// Deny lists more IPv4 ranges no sandbox may ever reach, whatever its
	// policy: the control plane's addresses, for instance.
	Deny []netip.Prefix
	// Resolver resolves the names of Allow rules (default
	// net.DefaultResolver).
	Resolver Resolver

	// Name is the instance name (default "dsec", at most 7 characters,
	// letters and digits). One Manager per name runs on a node (New
	// returns errdefs.Conflict for a second); Managers of different names
	// need names that are not prefixes of each other, and disjoint ranges.
	Name string
	// Gateway is the link-local address sandboxes route through (default
	// 169.254.1.1).
	Gateway netip.Addr
	// NetnsDir and StateDir override DefaultNetnsDir and DefaultStateDir.
	NetnsDir, StateDir string
}

// Resolver is the subset of *net.Resolver used to resolve Allow rules.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Endpoint is a sandbox's network, as the runtime needs it.
type Endpoint struct {
	ID string
	// NetnsPath is the namespace's bind mount; join it with EnterNetns.
	NetnsPath string
	// Addr is the sandbox's address (on eth0, as a /32).
	Addr netip.Addr
	// Gateway is the sandbox's default gateway.
	Gateway netip.Addr
	// HostIf is the node-side veth.
	HostIf string
	// MAC is the sandbox's MAC address, the one the node's permanent
	// neighbour entry for Addr names (eth0's, or a microVM's NIC's), and
	// GatewayMAC the gateway's, for the sandbox's own neighbour entry.
	MAC, GatewayMAC net.HardwareAddr
	// DNS are the nameservers to write to the sandbox's /etc/resolv.conf:
	// those of Options.DNS the policy lets it reach. Empty means write
	// none.
	DNS []netip.Addr
	// Hosts are the names of the policy's Allow rules with the addresses
	// the node resolved, for the sandbox's /etc/hosts.
	Hosts map[string][]netip.Addr
}

// Mode is the egress mode of a Policy.
type Mode string

// The modes. The zero value is ModeNone.
const (
	ModeNone      Mode = "none"
	ModeAllowlist Mode = "allowlist"
	ModeOpen      Mode = "open"
)

// Proto is a transport protocol of a Rule or Port.
type Proto string

// The protocols. The zero value, in a Rule, means any protocol.
const (
	ProtoAny Proto = ""
	ProtoTCP Proto = "tcp"
	ProtoUDP Proto = "udp"
)

// Policy is what a sandbox may reach, and what may reach it.
type Policy struct {
	Mode Mode
	// Allow lists destinations: under ModeAllowlist the only ones, under
	// ModeOpen the private ranges it unlocks. The never-reachable ranges
	// stay denied even if listed.
	Allow []Rule
	// Inbound lists the sandbox ports the node may connect to (the ports
	// the runtime exposes).
	Inbound []Port
}

// SandboxSysctls are the network sysctls of every sandbox namespace (see
// the package documentation), as paths under /proc/sys/net and values;
// pingGroups is ping_group_range, every group of the namespace's owner.
// tcp_no_metrics_save: no per-destination TCP metrics (ip tcp_metrics),
// which would tell a reused namespace's next sandbox where its
// predecessors connected (Options.Reuse).
func SandboxSysctls(pingGroups string) [][2]string {
	return append([][2]string{
		{"ipv6/conf/all/disable_ipv6", "1"}, {"ipv6/conf/default/disable_ipv6", "1"},
		{"ipv4/tcp_no_metrics_save", "1"},
	}, LoopbackSysctls(pingGroups)...)
}

// LoopbackSysctls are the network sysctls of a namespace with only its
// loopback interface, which lives and dies with one sandbox: what
// commands may do there (bind low ports, ping) as in every sandbox
// namespace. IPv6 stays on: with no other interface it reaches only ::1,
// as IPv4 reaches only 127.0.0.0/8, and turning it off waits for the
// kernel's RTNL lock and tears down lo's IPv6 state, in every sandbox's
// start. TCP metrics concern reused namespaces, which this never is.
func LoopbackSysctls(pingGroups string) [][2]string {
	return [][2]string{{"ipv4/ip_unprivileged_port_start", "0"}, {"ipv4/ping_group_range", pingGroups}}
}

// Isolated reports whether p lets nothing in or out (ModeNone, no
// inbound port): such a sandbox needs no link to the node, only a
// namespace with its loopback interface.
func (p Policy) Isolated() bool {
	return (p.Mode == "" || p.Mode == ModeNone) && len(p.Inbound) == 0
}

// Rule allows one destination: a range (Prefix) or a DNS name (Host),
// optionally one protocol and a range of its ports.
type Rule struct {
	Prefix netip.Prefix
	Host   string
	Proto  Proto
	// Ports is the destination port range; zero means all ports. It
	// needs Proto.
	Ports PortRange
}

// PortRange is an inclusive range of ports; First 0 and Last 0 mean all.
type PortRange struct{ First, Last uint16 }

// Port is one inbound port.
type Port struct {
	Proto Proto
	Port  uint16
}

// Limits on a policy, which bound the nftables elements one sandbox adds.
const (
	maxRules       = 256
	maxAddrsPerDNS = 32
)

func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Proto, p.Port) }

func (r Rule) String() string {
	var b strings.Builder
	if r.Host != "" {
		b.WriteString(r.Host)
	} else {
		b.WriteString(r.Prefix.String())
	}
	if r.Proto != ProtoAny {
		b.WriteString(" " + string(r.Proto))
		if r.Ports != (PortRange{}) {
			fmt.Fprintf(&b, ":%d-%d", r.Ports.First, r.Ports.Last)
		}
	}
	return b.String()
}

// invalid returns an errdefs.Invalid error with code "invalid_network_policy".
func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.Invalid, api.CodeInvalidNetworkPolicy, format, args...)
}
