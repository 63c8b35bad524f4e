// Package cgroups puts each sandbox's processes into a control group per
// hierarchy, limits their CPU, memory and pids, and freezes, kills and
// removes them, on cgroup v1, v2 and hybrid hosts behind one API.
//
// # Layouts
//
// New reads /proc/self/mountinfo under Options.Root (/sys/fs/cgroup):
//
//   - v2: Root is a cgroup2 mount. One directory per sandbox,
//     <Root>/<Parent>/<id>; the parent enables the cpu, memory and pids
//     controllers for its children. Limits: memory.max, memory.swap.max=0,
//     memory.oom.group=1, pids.max, cpu.max, cpu.weight. cgroup.freeze
//     freezes, cgroup.kill kills.
//   - hybrid (the development host, docs/machine.md): the resource
//     controllers are v1 hierarchies <Root>/<controller> and a cgroup2 tree
//     without controllers is mounted at <Root>/unified. Each sandbox gets a
//     directory in the v1 cpu, memory, pids and devices hierarchies AND one
//     in the unified tree. The unified group gives the sandbox its cgroup2
//     id (for eBPF attribution and cgroup-bpf attach), and its core files
//     need no controller: cgroup.freeze freezes, cgroup.kill kills (5.14+;
//     verified here on the controller-less tree), cpu.stat counts CPU time.
//     So hybrid hosts use neither the v1 freezer nor cpuacct.
//   - v1 (no cgroup2 mount): cpu, cpuacct, memory, pids, freezer and
//     devices hierarchies; freezer.state freezes; Kill freezes, SIGKILLs
//     every member through a pidfd, thaws and waits.
//
// Under v1 CLONE_INTO_CGROUP cannot place a child, so the runtime starts
// the child held on a sync pipe, calls [Group.AddProc] (one cgroup.procs
// write per hierarchy) and then releases it.
//
// # v1 limits
//
// memory.limit_in_bytes, and memory.memsw.limit_in_bytes at the same value
// where swap accounting exists, so a sandbox never swaps (v2:
// memory.swap.max=0). The OOM killer runs inside the memory cgroup; the
// parent's oom_kill_disable is checked to be 0 (children inherit it).
// v1 has no memory.oom.group: the kernel kills the largest task of the
// group, not all of them. With [Limits].AgentMemoryBytes a group gets a
// child memory group for its commands ([CommandsGroup], where
// [Group.AddCommandThread] puts the thread that forks them), so that the
// largest task is chosen among the commands and never the process that
// starts them. pids.max,
// cpu.cfs_quota_us (period 100 ms) and cpu.shares as given. The devices
// hierarchy of the parent allows only Docker's default device list
// (null, zero, full, random, urandom, tty, console, ptmx, pts, mknod of
// any); children inherit it, so it costs a sandbox one mkdir. On pure v2
// hosts the equivalent is a cgroup/dev BPF program on [Group.Path2],
// which this package does not attach.
//
// # Speed
//
// Measured on the development host (2 vCPU, hybrid): see
// BenchmarkCreateAddDestroy and RATIONALE.md in this directory.
package cgroups
