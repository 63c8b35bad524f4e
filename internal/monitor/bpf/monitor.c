// SPDX-License-Identifier: (MIT OR GPL-2.0)
// DSec's sandbox monitor: exec and the exit of watched system calls, for
// tasks in the cgroup2 groups the node watches (its sandboxes). Built
// with `go generate` (bpf2go, clang); the objects are committed.
//
// Both programs are tp_btf (what loads on the development host: BPF-LSM,
// fentry and kprobes do not). sys_exit, not sys_enter: a call seccomp
// refuses never reaches sys_enter's tracepoint, but still exits, with its
// errno, so attempts the filter blocked are seen too, with their verdict.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// Minimal kernel types: CO-RE relocates their fields against the
// running kernel's BTF.
struct pt_regs {
	unsigned long di, si, dx, r10, orig_ax;
} __attribute__((preserve_access_index));

struct qstr {
	__u64 hash_len;
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct qstr d_name;
	struct super_block *d_sb;
} __attribute__((preserve_access_index));

struct path {
	void *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
	struct file *file;
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long arg_start, arg_end;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	char comm[16];
	struct mm_struct *mm;
	struct css_set *cgroups;
} __attribute__((preserve_access_index));

#define KIND_EXEC 1
#define KIND_SYSCALL 2
#define KIND_OOM 3
#define PATH_LEN 160
#define ARGV_LEN 256

struct event {
	__u64 cgroup;
	__u64 args[3];
	__s64 ret;
	__u32 kind;
	__u32 nr;
	__u32 pid;
	__u32 tgid;
	__u32 uid;
	__u32 _pad;
	char comm[16];
	char path[PATH_LEN]; // exec: the file; syscalls: the path or address argument
	__u32 argv_len;      // exec: bytes of argv (NUL-separated) in argv
	__u32 _pad2;
	char argv[ARGV_LEN];
};

// Referenced so that the types are in the object's BTF (bpf2go -type).
const struct event *unused_event __attribute__((unused));
const struct exec_key *unused_exec_key __attribute__((unused));
const struct exec_policy *unused_exec_policy __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} watched SEC(".maps");

// syscalls maps a syscall number to what to report: 0 nothing (not
// watched), 1 the call and its arguments, 2 also a string at args[0], 3 a
// string at args[1], 4 a socket address at args[1] (args[2] bytes, at
// most 28: IPv4 and IPv6), 5 a string at args[1] if args[2] (open flags)
// asks to write, create or truncate (openat: reads are too many to send),
// 6 the call and its arguments if it failed (clone: successes are too
// many to send).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, __u8);
} syscalls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

// dropped counts events the ring buffer had no room for.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

// Allowed executables. A cgroup2 group with an entry in exec_policies may
// run only files on the file system root_dev (its root's: nothing else
// a sandbox can execute from is meant to hold programs, and a memfd is
// on none) at a path in exec_allowed: exactly, "dir/*" for any file
// directly in dir, or "dir/**" for any file below dir (one lookup per
// directory level). The path is the one the kernel is about to run,
// rebuilt from its dentries up to the file system's root: symlinks,
// relative paths, /proc/self/fd and execveat are all resolved by then,
// and a script's exec is its interpreter's. Any other exec is killed
// (SIGKILL, pending before the new program's first instruction).
#define XPATH 256
#define XDEPTH 24

struct exec_policy {
	__u64 root_dev;
};

struct exec_key {
	__u64 cgroup;
	char path[XPATH];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct exec_policy);
} exec_policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct exec_key);
	__type(value, __u8);
} exec_allowed SEC(".maps");

// The key being built, with room for a name read past its end.
struct exec_scratch {
	struct exec_key k;
	char spill[XPATH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct exec_scratch);
} exec_scratch SEC(".maps");

// in_path bounds an index into a path for the verifier, with a mask
// clang cannot drop.
static __always_inline __u64 in_path(__u64 i) {
	asm volatile("%0 &= 255" : "+r"(i));
	return i;
}

// exec_allowed_file reports whether the group cg (policy pol) may run
// bprm's file.
static __always_inline int exec_allowed_file(struct linux_binprm *bprm, __u64 cg, struct exec_policy *pol) {
	struct dentry *d = BPF_CORE_READ(bprm, file, f_path.dentry);
	if (!d || (__u64)BPF_CORE_READ(d, d_sb, s_dev) != pol->root_dev)
		return 0;
	struct dentry *chain[XDEPTH];
	int n = 0, top = 0;
	for (int i = 0; i < XDEPTH; i++) {
		struct dentry *parent = BPF_CORE_READ(d, d_parent);
		if (!parent || parent == d) {
			top = 1;
			break;
		}
		chain[i] = d;
		n = i + 1;
		d = parent;
	}
	if (!top || n == 0)
		return 0; // deeper than XDEPTH: refused
	__u32 zero = 0;
	struct exec_scratch *s = bpf_map_lookup_elem(&exec_scratch, &zero);
	if (!s)
		return 0;
	__u64 *w = (__u64 *)s;
	for (int i = 0; i < (int)(sizeof(*s) / 8); i++)
		w[i] = 0;
	s->k.cgroup = cg;
	__u32 off = 0;
	for (int i = XDEPTH - 1; i >= 0; i--) {
		if (i >= n)
			continue;
		if (off >= XPATH - 3)
			return 0; // too long: refused
		// The directory built so far, as "dir/**" (every file below it).
		s->k.path[in_path(off)] = '/';
		s->k.path[in_path(off + 1)] = '*';
		s->k.path[in_path(off + 2)] = '*';
		if (bpf_map_lookup_elem(&exec_allowed, &s->k))
			return 1;
		s->k.path[in_path(off + 2)] = 0;
		if (i == 0) {
			// The leaf's directory, as "dir/*".
			if (bpf_map_lookup_elem(&exec_allowed, &s->k))
				return 1;
		}
		s->k.path[in_path(off)] = '/';
		off++;
		const unsigned char *name = BPF_CORE_READ(chain[i], d_name.name);
		long r = bpf_probe_read_kernel_str(&s->k.path[in_path(off)], XPATH, name);
		if (r <= 1)
			return 0;
		off += r - 1;
	}
	if (off >= XPATH)
		return 0;
	return bpf_map_lookup_elem(&exec_allowed, &s->k) != 0;
}

static __always_inline struct event *reserve(__u64 cg, __u32 kind) {
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 k = 0;
		__u64 *n = bpf_map_lookup_elem(&dropped, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	__u64 pt = bpf_get_current_pid_tgid();
	e->cgroup = cg;
	e->kind = kind;
	e->pid = (__u32)pt;
	e->tgid = pt >> 32;
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->nr = 0;
	e->ret = 0;
	e->args[0] = e->args[1] = e->args[2] = 0;
	e->path[0] = 0;
	e->argv_len = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return e;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm) {
	__u64 cg = bpf_get_current_cgroup_id();
	int blocked = 0;
	struct exec_policy *pol = bpf_map_lookup_elem(&exec_policies, &cg);
	if (pol && !exec_allowed_file(bprm, cg, pol)) {
		bpf_send_signal(9); // SIGKILL
		blocked = 1;
	}
	if (!bpf_map_lookup_elem(&watched, &cg))
		return 0;
	struct event *e = reserve(cg, KIND_EXEC);
	if (!e)
		return 0;
	if (blocked)
		e->ret = -1; // EPERM: refused
	const char *f = BPF_CORE_READ(bprm, filename);
	bpf_probe_read_kernel_str(e->path, sizeof(e->path), f);
	// The new program's arguments, on its stack by now.
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	unsigned long start = BPF_CORE_READ(task, mm, arg_start);
	unsigned long end = BPF_CORE_READ(task, mm, arg_end);
	if (end > start) {
		unsigned long n = end - start;
		if (n > ARGV_LEN - 1)
			n = ARGV_LEN - 1;
		n &= ARGV_LEN - 1;
		if (bpf_probe_read_user(e->argv, n, (const void *)start) == 0)
			e->argv_len = n;
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret) {
	__u32 nr = (__u32)BPF_CORE_READ(regs, orig_ax);
	__u8 *what = bpf_map_lookup_elem(&syscalls, &nr);
	if (!what || !*what)
		return 0;
	__u64 cg = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&watched, &cg))
		return 0;
	__u64 a0 = BPF_CORE_READ(regs, di), a1 = BPF_CORE_READ(regs, si), a2 = BPF_CORE_READ(regs, dx);
	__u8 w = *what;
	if (w == 5 && !(a2 & 01103)) // O_WRONLY|O_RDWR|O_CREAT|O_TRUNC
		return 0;
	if (w == 6 && ret >= 0)
		return 0;
	// A successful execve is the exec event (its path argument is gone
	// with the old memory by now).
	if ((nr == 59 || nr == 322) && ret == 0)
		return 0;
	struct event *e = reserve(cg, KIND_SYSCALL);
	if (!e)
		return 0;
	e->nr = nr;
	e->ret = ret;
	e->args[0] = a0;
	e->args[1] = a1;
	e->args[2] = a2;
	if (w == 2) {
		bpf_probe_read_user_str(e->path, sizeof(e->path), (const void *)a0);
	} else if (w == 3 || w == 5) {
		bpf_probe_read_user_str(e->path, sizeof(e->path), (const void *)a1);
	} else if (w == 4) {
		__u32 n = a2 > 28 ? 28 : (__u32)a2;
		bpf_probe_read_user(e->path, n & 31, (const void *)a1);
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

// An OOM kill: the victim of a watched group (its memory limit, or the
// host's), reported with the victim's ids, not the allocating task's.
SEC("tp_btf/mark_victim")
int BPF_PROG(on_oom_victim, struct task_struct *task, __u32 uid) {
	__u64 cg = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	if (!bpf_map_lookup_elem(&watched, &cg))
		return 0;
	struct event *e = reserve(cg, KIND_OOM);
	if (!e)
		return 0;
	e->pid = BPF_CORE_READ(task, pid);
	e->tgid = BPF_CORE_READ(task, tgid);
	e->uid = uid;
	BPF_CORE_READ_STR_INTO(&e->comm, task, comm);
	bpf_ringbuf_submit(e, 0);
	return 0;
}
