package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	mdnetlink "github.com/mdlayher/netlink"

	"github.com/dsec-dev/dsec/internal/sys"
)

// Kernel constants nftables expressions need (linux/netfilter*.h); the
// nftables package does not export them and x/sys/unix is internal/sys's.
const (
	nfprotoIPv4          = 2      // NFPROTO_IPV4
	ctDirReply           = 1      // IP_CT_DIR_REPLY
	rejectTCPRST         = 1      // NFT_REJECT_TCP_RST
	rejectICMPX          = 2      // NFT_REJECT_ICMPX_UNREACH
	icmpxAdminProhibited = 3      // NFT_REJECT_ICMPX_ADMIN_PROHIBITED
	ipsDstNAT            = 1 << 5 // IPS_DST_NAT
	icmpDestUnreach      = 3
	icmpTimeExceeded     = 11

	// 32-bit registers: NFT_REG32_00 is 8; NFT_REG_1 (16 bytes) is 1.
	reg1 = 1
	r32  = 8
)

// Set names of the table. The layout is described in RATIONALE.md.
const (
	setSpoof     = "spoof"      // ifname . ipv4: each sandbox veth and the only source it may use
	setNever     = "never"      // ipv4 intervals no sandbox reaches
	setPrivate   = "private"    // ipv4 intervals reached only through allow rules
	setOpen      = "open"       // sandbox addresses in ModeOpen
	setAllowHost = "allow_host" // saddr . daddr: one address, any protocol
	setAllowPort = "allow_port" // saddr . daddr . proto . port: one address and port
	// Ranges go to concatenated range sets (pipapo), whose updates cost
	// time linear in the set's size: they are sharded by the sandbox
	// address's low bits, allow_any_NN and allow_l4_NN.
	setAllowAny = "allow_any_" // saddr . daddr-range: any protocol
	setAllowL4  = "allow_l4_"  // saddr . daddr-range . proto . port-range
	setShards   = "shards"     // saddr & (rangeShards-1) : jump range_NN
	setInbound  = "inbound"    // daddr . proto . port the node may connect to
	setUplinks  = "uplinks"    // ifname: interfaces egress is masqueraded out of
)

// elem is one set element; end is set for concatenated range sets.
type elem struct {
	set      string
	key, end []byte
}

func (e elem) id() string { return e.set + "/" + string(e.key) + "/" + string(e.end) }

// nftSetup serialises the creation of sets across Conns: the nftables
// package numbers new sets from a package-level counter.
var nftSetup sync.Mutex

// firewall is the nftables table of one Manager. It is safe for
// concurrent use.
type firewall struct {
	table  *nftables.Table
	prefix string // host-side veth name prefix

	// mu guards the following fields.
	mu   sync.Mutex
	conn *nftables.Conn
	sets map[string]*nftables.Set
}

func newFirewall(name string) (*firewall, error) {
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(c *mdnetlink.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		return sys.ForceSocketBuffers(rc, sockBuffer)
	}))
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	return &firewall{
		table:  &nftables.Table{Name: name, Family: nftables.TableFamilyINet},
		prefix: name,
		conn:   conn,
	}, nil
}

func (f *firewall) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conn.CloseLasting()
}

// layout is what install writes besides the sandboxes' elements.
type layout struct {
	rng           netip.Prefix
	never, privat []addrRange
	uplinks       []string // nil: masquerade out of every non-sandbox interface
}

// install replaces the table (if any) with a fresh one holding l and
// elems, in one transaction: packets see either the old table or the new.
func (f *firewall) install(l layout, elems []elem) error {
	nftSetup.Lock()
	defer nftSetup.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.conn
	if t, err := c.ListTableOfFamily(f.table.Name, f.table.Family); err == nil && t != nil {
		c.DelTable(f.table)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("listing table %s: %w", f.table.Name, err)
	}
	c.AddTable(f.table)

	t := f.table
	ifname, ipv4 := nftables.TypeIFName, nftables.TypeIPAddr
	l4Key := nftables.MustConcatSetType(ipv4, ipv4, nftables.TypeInetProto, nftables.TypeInetService)
	sets := map[string]*nftables.Set{
		setSpoof:     {Table: t, Name: setSpoof, KeyType: nftables.MustConcatSetType(ifname, ipv4), Concatenation: true},
		setNever:     {Table: t, Name: setNever, KeyType: ipv4, Interval: true},
		setPrivate:   {Table: t, Name: setPrivate, KeyType: ipv4, Interval: true},
		setOpen:      {Table: t, Name: setOpen, KeyType: ipv4},
		setAllowHost: {Table: t, Name: setAllowHost, KeyType: nftables.MustConcatSetType(ipv4, ipv4), Concatenation: true},
		setAllowPort: {Table: t, Name: setAllowPort, KeyType: l4Key, Concatenation: true},
		setShards:    {Table: t, Name: setShards, KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict, IsMap: true, Constant: true},
		setInbound:   {Table: t, Name: setInbound, KeyType: nftables.MustConcatSetType(ipv4, nftables.TypeInetProto, nftables.TypeInetService), Concatenation: true},
		// Host byte order is what nft(8) records for ifname sets; it only
		// matters to how `nft list` prints the elements.
		setUplinks: {Table: t, Name: setUplinks, KeyType: ifname, KeyByteOrder: binaryutil.NativeEndian},
	}
	static := map[string][]nftables.SetElement{
		setNever:   intervalElems(l.never),
		setPrivate: intervalElems(l.privat),
	}
	for i := range rangeShards {
		any, l4 := shardName(setAllowAny, i), shardName(setAllowL4, i)
		sets[any] = &nftables.Set{Table: t, Name: any, KeyType: nftables.MustConcatSetType(ipv4, ipv4), Interval: true, Concatenation: true}
		sets[l4] = &nftables.Set{Table: t, Name: l4, KeyType: l4Key, Interval: true, Concatenation: true}
		static[setShards] = append(static[setShards], nftables.SetElement{Key: be32(uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: shardName("range_", i)}})
	}
	for _, u := range l.uplinks {
		static[setUplinks] = append(static[setUplinks], nftables.SetElement{Key: ifnameKey(u)})
	}
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		if name == setShards {
			continue
		}
		if err := c.AddSet(sets[name], static[name]); err != nil {
			return fmt.Errorf("adding set %s: %w", name, err)
		}
	}
	f.sets = sets
	for i := range rangeShards { // the chains the shards map jumps to
		c.AddChain(&nftables.Chain{Name: shardName("range_", i), Table: t})
	}
	if err := c.AddSet(sets[setShards], static[setShards]); err != nil {
		return fmt.Errorf("adding set %s: %w", setShards, err)
	}
	f.addChainsLocked(l)
	// The sandboxes' elements go in the same transaction unless there are
	// very many: then the rest follow in more (whose sandboxes see their
	// traffic refused for those milliseconds: failing closed).
	first, rest := elems[:min(len(elems), batchElems)], elems[min(len(elems), batchElems):]
	if err := f.queueLocked(first, false); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing table inet %s: %w", t.Name, err)
	}
	for len(rest) > 0 {
		n := min(len(rest), batchElems)
		if err := f.queueLocked(rest[:n], false); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("installing table inet %s: %w", t.Name, err)
		}
		rest = rest[n:]
	}
	return nil
}

// rangeShards is how many shards the range sets have (a power of two).
const rangeShards = 64

func shard(a netip.Addr) int { return int(u32(a) & (rangeShards - 1)) }

func shardName(prefix string, i int) string { return fmt.Sprintf("%s%02d", prefix, i) }

// Limits of one netlink message and one transaction: a message's element
// list is an attribute, whose length is 16 bits; a transaction is one
// sendmsg, which must fit the socket buffer (sockBuffer).
const (
	msgElems   = 256
	batchElems = 50_000
	sockBuffer = 32 << 20
)

// queueLocked adds messages adding (or deleting) es to the pending batch.
// Preconditions: f.mu must be held.
func (f *firewall) queueLocked(es []elem, del bool) error {
	for _, set := range slices.Sorted(maps.Keys(groupElems(es))) {
		all := groupElems(es)[set]
		for len(all) > 0 {
			n := min(len(all), msgElems)
			var err error
			if del {
				err = f.conn.SetDeleteElements(f.sets[set], all[:n])
			} else {
				err = f.conn.SetAddElements(f.sets[set], all[:n])
			}
			if err != nil {
				return fmt.Errorf("set %s: %w", set, err)
			}
			all = all[n:]
		}
	}
	return nil
}

// remove deletes the table, if it exists.
func (f *firewall) remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.conn.ListTableOfFamily(f.table.Name, f.table.Family)
	if err != nil || t == nil {
		return nil
	}
	f.conn.DelTable(f.table)
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("deleting table inet %s: %w", f.table.Name, err)
	}
	return nil
}

// apply deletes del and adds add in one transaction.
func (f *firewall) apply(add, del []elem) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.queueLocked(del, true); err != nil {
		return err
	}
	if err := f.queueLocked(add, false); err != nil {
		return err
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("updating table inet %s: %w", f.table.Name, err)
	}
	return nil
}

func groupElems(es []elem) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for _, e := range es {
		out[e.set] = append(out[e.set], nftables.SetElement{Key: e.key, KeyEnd: e.end})
	}
	return out
}

// intervalElems encodes disjoint sorted ranges for a one-field interval
// set: a start element and an end element one past the range.
func intervalElems(rs []addrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range mergeRanges(rs) {
		out = append(out, nftables.SetElement{Key: be32(r.first)})
		if r.last != ^uint32(0) {
			out = append(out, nftables.SetElement{Key: be32(r.last + 1), IntervalEnd: true})
		}
	}
	return out
}

// Element keys. Fields of concatenations are padded to 4 bytes.

func spoofElem(ifname string, addr netip.Addr) elem {
	return elem{set: setSpoof, key: append(ifnameKey(ifname), be32(u32(addr))...)}
}

func openElem(addr netip.Addr) elem {
	return elem{set: setOpen, key: be32(u32(addr))}
}

func policyElems(addr netip.Addr, c *compiled) []elem {
	src := be32(u32(addr))
	var out []elem
	if c.open {
		out = append(out, openElem(addr))
	}
	for _, r := range c.any {
		if r.first == r.last {
			out = append(out, elem{set: setAllowHost, key: cat(src, be32(r.first))})
			continue
		}
		out = append(out, elem{set: shardName(setAllowAny, shard(addr)),
			key: cat(src, be32(r.first)),
			end: cat(src, be32(r.last))})
	}
	for _, r := range c.l4 {
		if r.addr.first == r.addr.last && r.ports.First == r.ports.Last {
			out = append(out, elem{set: setAllowPort,
				key: cat(src, be32(r.addr.first), []byte{r.proto, 0, 0, 0}, port32(r.ports.First))})
			continue
		}
		out = append(out, elem{set: shardName(setAllowL4, shard(addr)),
			key: cat(src, be32(r.addr.first), []byte{r.proto, 0, 0, 0}, port32(r.ports.First)),
			end: cat(src, be32(r.addr.last), []byte{r.proto, 0, 0, 0}, port32(r.ports.Last))})
	}
	for _, p := range c.inbound {
		out = append(out, elem{set: setInbound,
			key: cat(src, []byte{protoNum(p.Proto), 0, 0, 0}, port32(p.Port))})
	}
	return out
}

// diffElems returns the elements of next missing from prev, and those of
// prev missing from next.
func diffElems(prev, next []elem) (add, del []elem) {
	in := func(es []elem) map[string]bool {
		m := make(map[string]bool, len(es))
		for _, e := range es {
			m[e.id()] = true
		}
		return m
	}
	p, n := in(prev), in(next)
	for _, e := range next {
		if !p[e.id()] {
			add = append(add, e)
		}
	}
	for _, e := range prev {
		if !n[e.id()] {
			del = append(del, e)
		}
	}
	return add, del
}

func ifnameKey(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func port32(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

func cat(parts ...[]byte) []byte { return slices.Concat(parts...) }

// Chains. The rules, in nft syntax (P is the veth prefix):
//
//	chain prerouting { type filter hook prerouting priority raw
//	  iifname "P*" meta nfproto != ipv4 drop
//	  iifname "P*" iifname . ip saddr != @spoof drop }
//	chain input { type filter hook input priority filter
//	  iifname "P*" ct state established,related accept
//	  iifname "P*" goto deny }
//	chain output { type filter hook output priority filter
//	  oifname "P*" ct state established,related accept
//	  oifname "P*" meta nfproto ipv4 icmp type { destination-unreachable, time-exceeded } accept
//	  oifname "P*" meta nfproto ipv4 ip daddr . meta l4proto . th dport @inbound accept
//	  oifname "P*" goto deny }
//	chain forward { type filter hook forward priority filter
//	  iifname "P*" jump egress
//	  oifname "P*" jump ingress }
//	chain egress {
//	  meta nfproto != ipv4 drop
//	  ct direction reply accept
//	  ip daddr @never goto deny
//	  ip saddr . ip daddr @allow_host accept
//	  ip saddr . ip daddr . meta l4proto . th dport @allow_port accept
//	  ip saddr & 0.0.0.63 vmap @shards              (jump range_NN)
//	  ...
//	  ip daddr @private goto deny
//	  ip saddr @open accept
//	  goto deny }
//	chain range_NN {                                  (NN = saddr & 63)
//	  ip saddr . ip daddr @allow_any_NN accept
//	  ip saddr . ip daddr . meta l4proto . th dport @allow_l4_NN accept }
//	chain ingress {
//	  meta nfproto != ipv4 drop
//	  ct state established,related accept
//	  ct status dnat ip daddr . meta l4proto . th dport @inbound accept
//	  drop }
//	chain deny {
//	  meta l4proto tcp reject with tcp reset
//	  reject with icmpx admin-prohibited }
//	chain postrouting { type nat hook postrouting priority srcnat
//	  meta nfproto ipv4 ip saddr RANGE oifname @uplinks masquerade }
//	  (without uplinks: ... oifname != "P*" masquerade)
//
// Preconditions: f.mu must be held.
func (f *firewall) addChainsLocked(l layout) {
	c, t := f.conn, f.table
	accept := func() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }
	drop := func() expr.Any { return &expr.Verdict{Kind: expr.VerdictDrop} }
	to := func(kind expr.VerdictKind, chain string) expr.Any { return &expr.Verdict{Kind: kind, Chain: chain} }
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: slices.Concat(exprs...)})
	}
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		accept := nftables.ChainPolicyAccept
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
	}
	regular := func(name string) *nftables.Chain { return c.AddChain(&nftables.Chain{Name: name, Table: t}) }
	ifPrefix := func(key expr.MetaKey) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: key, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte(f.prefix)},
		}
	}
	iif, oif := ifPrefix(expr.MetaKeyIIFNAME), ifPrefix(expr.MetaKeyOIFNAME)
	nfproto := func(op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
			&expr.Cmp{Op: op, Register: reg1, Data: []byte{nfprotoIPv4}},
		}
	}
	ctEstablished := []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	lookup := func(set string, invert bool) expr.Any {
		s := f.sets[set]
		return &expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID, Invert: invert}
	}
	daddr := func(reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	}
	saddr := func(reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
	}
	l4proto := func(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }
	dport := func(reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	}
	// daddr . l4proto . dport in registers 1.. for @inbound.
	inboundKey := []expr.Any{daddr(r32 + 0), l4proto(r32 + 1), dport(r32 + 2), lookup(setInbound, false)}

	deny := regular("deny")
	rule(deny, []expr.Any{l4proto(reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ipprotoTCP}},
		&expr.Reject{Type: rejectTCPRST}})
	rule(deny, []expr.Any{&expr.Reject{Type: rejectICMPX, Code: icmpxAdminProhibited}})

	egress := regular("egress")
	rule(egress, nfproto(expr.CmpOpNeq), []expr.Any{drop()})
	rule(egress, []expr.Any{&expr.Ct{Key: expr.CtKeyDIRECTION, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ctDirReply}}, accept()})
	rule(egress, []expr.Any{daddr(reg1), lookup(setNever, false), to(expr.VerdictGoto, "deny")})
	rule(egress, []expr.Any{saddr(r32 + 0), daddr(r32 + 1), lookup(setAllowHost, false), accept()})
	rule(egress, []expr.Any{saddr(r32 + 0), daddr(r32 + 1), l4proto(r32 + 2), dport(r32 + 3), lookup(setAllowPort, false), accept()})
	rule(egress, []expr.Any{saddr(reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: be32(rangeShards - 1), Xor: be32(0)},
		&expr.Lookup{SourceRegister: reg1, SetName: setShards, SetID: f.sets[setShards].ID, IsDestRegSet: true, DestRegister: 0}})
	for i := range rangeShards {
		ch := &nftables.Chain{Name: shardName("range_", i), Table: t}
		rule(ch, []expr.Any{saddr(r32 + 0), daddr(r32 + 1), lookup(shardName(setAllowAny, i), false), accept()})
		rule(ch, []expr.Any{saddr(r32 + 0), daddr(r32 + 1), l4proto(r32 + 2), dport(r32 + 3), lookup(shardName(setAllowL4, i), false), accept()})
	}
	rule(egress, []expr.Any{daddr(reg1), lookup(setPrivate, false), to(expr.VerdictGoto, "deny")})
	rule(egress, []expr.Any{saddr(reg1), lookup(setOpen, false), accept()})
	rule(egress, []expr.Any{to(expr.VerdictGoto, "deny")})

	ingress := regular("ingress")
	rule(ingress, nfproto(expr.CmpOpNeq), []expr.Any{drop()})
	rule(ingress, ctEstablished, []expr.Any{accept()})
	// Port forwards the node sets up (DNAT) to exposed ports; a neighbour
	// that merely routes to the sandbox range gets nothing.
	rule(ingress, []expr.Any{&expr.Ct{Key: expr.CtKeySTATUS, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)}},
		inboundKey, []expr.Any{accept()})
	rule(ingress, []expr.Any{drop()})

	pre := base("prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	rule(pre, iif, nfproto(expr.CmpOpNeq), []expr.Any{drop()})
	rule(pre, iif, []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}, saddr(r32 + 4),
		lookup(setSpoof, true), drop()})

	in := base("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	rule(in, iif, ctEstablished, []expr.Any{accept()})
	rule(in, iif, []expr.Any{to(expr.VerdictGoto, "deny")})

	out := base("output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
	rule(out, oif, ctEstablished, []expr.Any{accept()})
	for _, typ := range []byte{icmpDestUnreach, icmpTimeExceeded} {
		rule(out, oif, nfproto(expr.CmpOpEq), []expr.Any{
			l4proto(reg1), &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ipprotoICMP}},
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{typ}}, accept()})
	}
	rule(out, oif, nfproto(expr.CmpOpEq), inboundKey, []expr.Any{accept()})
	rule(out, oif, []expr.Any{to(expr.VerdictGoto, "deny")})

	fwd := base("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	rule(fwd, iif, []expr.Any{to(expr.VerdictJump, "egress")})
	rule(fwd, oif, []expr.Any{to(expr.VerdictJump, "ingress")})

	post := base("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	rp := prefixRange(l.rng)
	masq := slices.Concat(nfproto(expr.CmpOpEq), []expr.Any{
		saddr(reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: be32(^(rp.last - rp.first)), Xor: be32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: be32(rp.first)},
	})
	if len(l.uplinks) > 0 {
		rule(post, masq, []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1}, lookup(setUplinks, false), &expr.Masq{}})
	} else {
		rule(post, masq, []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte(f.prefix)}, &expr.Masq{}})
	}
}
