// Package monitor watches sandboxes with eBPF: every exec, and the exit of
// the system calls that escapes and reward hacks go through (mount,
// ptrace, bpf, module loading, namespaces, privilege changes, signals,
// sockets and connects, writes, deletes and renames of files), for the
// tasks of the cgroup2 groups it is told to watch. Each event carries
// the call's return value: a call seccomp or the kernel refused is seen
// with its errno, so blocked attempts are reported too.
//
// The programs are tp_btf ones (bpf/monitor.c, built by `go generate`
// with bpf2go and clang; the objects are committed, so building DSec
// needs neither). They are attached once for the whole host and filter
// by cgroup2 id in the kernel: an unwatched task costs a map lookup per
// watched system call. On a kernel where they do not load, Start fails
// with an error wrapping errdefs.ErrNotSupported and the node runs
// without a monitor, its host-side rules unchanged (the monitor observes;
// it is never the only defence).
package monitor
