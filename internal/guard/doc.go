// Package guard attaches DSec's cgroup-bpf programs to the cgroup2
// parent of the sandboxes (so every sandbox's group inherits them): they
// refuse connects and sends to link-local and cloud metadata addresses,
// and raw IP sockets, whatever a sandbox's network policy (the node's
// DNS resolvers excepted, on port 53). (Packet
// sockets never reach the cgroup sock_create hook, which sees inet
// sockets only: capabilities and seccomp refuse those.)
// nftables (package network) and seccomp refuse the same things: the
// guard is the layer that still holds if one of them is misconfigured or
// bypassed. The programs are built by `go generate` (bpf2go, clang) from
// bpf/guard.c; the objects are committed.
package guard
