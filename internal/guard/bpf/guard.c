// SPDX-License-Identifier: (MIT OR GPL-2.0)
// DSec's cgroup-bpf guard: attached to the cgroup2 parent of every
// sandbox, it refuses what no sandbox may do whatever its network policy,
// independently of nftables and seccomp: connecting or sending to a
// link-local or cloud metadata address, raw IP sockets, and any device
// but those of a sandbox's minimal /dev (mknod of anything). (Packet
// sockets are not inet sockets: the sock_create hook never sees them;
// capabilities and seccomp refuse them.) Built with `go generate`
// (bpf2go, clang); objects committed.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

#define AF_INET 2
#define AF_INET6 10
#define SOCK_RAW 3

struct key4 {
	__u32 prefixlen;
	__u32 addr;
};

struct key6 {
	__u32 prefixlen;
	__u32 addr[4];
};

// Destinations refused, as LPM tries filled by the node.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__type(key, struct key4);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} deny4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__type(key, struct key6);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} deny6 SEC(".maps");

// The node's DNS resolvers, allowed on port 53 even inside a denied range
// (a cloud's link-local resolver, 169.254.169.253 on AWS).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u8);
} dns4 SEC(".maps");

static __always_inline int allowed4(struct bpf_sock_addr *ctx) {
	__u32 ip = ctx->user_ip4;
	if (ctx->user_port == bpf_htons(53) && bpf_map_lookup_elem(&dns4, &ip))
		return 1;
	struct key4 k = {.prefixlen = 32, .addr = ip};
	return bpf_map_lookup_elem(&deny4, &k) ? 0 : 1;
}

static __always_inline int allowed6(struct bpf_sock_addr *ctx) {
	struct key6 k = {.prefixlen = 128};
	k.addr[0] = ctx->user_ip6[0];
	k.addr[1] = ctx->user_ip6[1];
	k.addr[2] = ctx->user_ip6[2];
	k.addr[3] = ctx->user_ip6[3];
	return bpf_map_lookup_elem(&deny6, &k) ? 0 : 1;
}

SEC("cgroup/connect4")
int connect4(struct bpf_sock_addr *ctx) { return allowed4(ctx); }

SEC("cgroup/sendmsg4")
int sendmsg4(struct bpf_sock_addr *ctx) { return allowed4(ctx); }

SEC("cgroup/connect6")
int connect6(struct bpf_sock_addr *ctx) { return allowed6(ctx); }

SEC("cgroup/sendmsg6")
int sendmsg6(struct bpf_sock_addr *ctx) { return allowed6(ctx); }

// Only inet sockets reach this hook.
SEC("cgroup/sock_create")
int sock_create(struct bpf_sock *sk) {
	if ((sk->family == AF_INET || sk->family == AF_INET6) && sk->type == SOCK_RAW)
		return 0;
	return 1;
}

// The character devices of a sandbox's /dev (guest.buildDev): null,
// zero, full, random, urandom, tty, its devpts' ptmx and terminals. Any
// other device, block devices and mknod of anything included, is refused
// (EPERM). The kernel never asks about overlayfs whiteouts (c 0:0).
SEC("cgroup/dev")
int device(struct bpf_cgroup_dev_ctx *ctx) {
	__u32 type = ctx->access_type & 0xffff;
	__u32 access = ctx->access_type >> 16;
	if (access & BPF_DEVCG_ACC_MKNOD || type != BPF_DEVCG_DEV_CHAR)
		return 0;
	switch (ctx->major) {
	case 1: // null zero full random urandom
		return ctx->minor == 3 || ctx->minor == 5 || ctx->minor == 7 || ctx->minor == 8 || ctx->minor == 9;
	case 5: // tty ptmx
		return ctx->minor == 0 || ctx->minor == 2;
	case 136: // pts
		return 1;
	}
	return 0;
}
