// Package guard attaches DSec's cgroup-bpf programs to the cgroup2
// parent of the sandboxes (so every sandbox's group inherits them): they
// refuse connects and sends to link-local and cloud metadata addresses,
// and raw IP sockets, whatever a sandbox's network policy (the node's
// DNS resolvers excepted, on port 53), and every device but the
// character devices of a sandbox's minimal /dev, mknod of anything
// included. (Packet sockets never reach the cgroup sock_create hook,
// which sees inet sockets only: capabilities and seccomp refuse those.)
// nftables (package network), seccomp, dropped capabilities and the
// minimal /dev refuse the same things: the guard is the layer that still
// holds if one of them is misconfigured or bypassed.
//
// The links can be pinned in the BPF file system (Options.PinDir), so
// that the guard outlives the node service that attached it (Guard.Keep)
// and the next one takes the same links over, replacing their programs
// in place. The programs are built by `go generate` (bpf2go, clang) from
// bpf/guard.c; the objects are committed.
package guard
