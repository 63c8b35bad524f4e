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
	unsigned long di, si, dx, r10, r8, orig_ax;
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

struct vfsmount {
	struct dentry *mnt_root;
} __attribute__((preserve_access_index));

// A mount: its vfsmount is embedded (mnt), where it is mounted on
// (mnt_mountpoint, a dentry of mnt_parent).
struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
} __attribute__((preserve_access_index));

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
} __attribute__((preserve_access_index));

struct fs_struct {
	struct path root, pwd;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
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
	struct fs_struct *fs;
	struct files_struct *files;
} __attribute__((preserve_access_index));

#define KIND_EXEC 1
#define KIND_SYSCALL 2
#define KIND_OOM 3
#define PATH_LEN 256
#define AUX_LEN 256

struct event {
	__u64 cgroup;
	__u64 ts; // bpf_ktime_get_ns: when it happened, not when user space read it
	__u64 args[3];
	__s64 ret;
	__u32 kind;
	__u32 nr;
	__u32 pid;
	__u32 tgid;
	__u32 uid;
	__u32 _pad;
	char comm[16];
	char path[PATH_LEN]; // exec: the file; syscalls: the path (see resolve_path) or address argument
	__u32 aux_len;       // exec: bytes of argv (NUL-separated) in aux
	__u32 _pad2;
	char aux[AUX_LEN];   // exec: its arguments; rename, link: the new name (see resolve_path)
};

// What to report of a watched system call (syscalls map, by number).
// Argument indexes count from 0; -1 is none.
#define WHEN_ALWAYS 1
#define WHEN_FAILED 2 // the call, only when it failed (clone: successes are too many to send)
#define WHEN_WRITE 3  // only if the open flags at args[flags] write, create or truncate (reads are too many to send)
// How a path argument is read: as given (a name that is no path: a
// module, a memfd, a file system type), against the cwd when relative,
// or (0 and up) against the directory of the fd at that argument.
#define DIR_RAW -2
#define DIR_CWD -1

struct syscall_spec {
	__u8 when;
	__s8 flags;
	__s8 path, dir;   // the path the call acts on (the old name of a rename or link)
	__s8 path2, dir2; // the new name of a rename or link
	__s8 addr;        // a socket address (its length at args[addr + 1], at most 28 bytes: IPv4 and IPv6)
	__u8 _pad;
};

// Referenced so that the types are in the object's BTF (bpf2go -type).
const struct event *unused_event __attribute__((unused));
const struct exec_key *unused_exec_key __attribute__((unused));
const struct exec_policy *unused_exec_policy __attribute__((unused));
const struct syscall_spec *unused_syscall_spec __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} watched SEC(".maps");

// syscalls maps a syscall number to what to report of it (when 0: not
// watched).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, struct syscall_spec);
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
	e->ts = bpf_ktime_get_ns();
	e->kind = kind;
	e->pid = (__u32)pt;
	e->tgid = pt >> 32;
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->nr = 0;
	e->ret = 0;
	e->args[0] = e->args[1] = e->args[2] = 0;
	e->path[0] = 0;
	e->aux[0] = 0;
	e->aux_len = 0;
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
		if (n > AUX_LEN - 1)
			n = AUX_LEN - 1;
		n &= AUX_LEN - 1;
		if (bpf_probe_read_user(e->aux, n, (const void *)start) == 0)
			e->aux_len = n;
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

// Paths. A relative path argument is made absolute in the kernel: the
// directory it is relative to (the cwd, or a directory fd's file) is
// rebuilt from its dentries, crossing mounts, up to the task's root (the
// sandbox's), and the name follows it: "/workspace/tests" + "/" +
// "test_x.py". What the name itself holds ("..", a symlink) is left as
// given (user space cleans "." and ".." lexically). A directory deeper
// than WALK steps (names and mounts), or a path longer than PATH_LEN
// bytes, leaves the name as given (relative).
#define WALK 32

struct path_scratch {
	__u64 chain[WALK];      // the directory's dentries, leaf first
	char buf[2 * PATH_LEN]; // the path being built, with room for a name read past PATH_LEN
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct path_scratch);
} path_scratch SEC(".maps");

// resolve_path builds in path_scratch's buf the absolute path of the
// string at user address name, relative to the directory of fd dirfd
// (AT_FDCWD: the cwd). It returns the path's length, or -1 if it could
// not be built (the caller then reports the name as given). A global
// function: the verifier checks it once, not at each call.
__attribute__((noinline)) int resolve_path(__u64 name, __s64 dirfd) {
	__u32 zero = 0;
	struct path_scratch *s = bpf_map_lookup_elem(&path_scratch, &zero);
	if (!s)
		return -1;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fs_struct *fs = BPF_CORE_READ(task, fs);
	if (!fs)
		return -1;
	struct dentry *root_d = BPF_CORE_READ(fs, root.dentry);
	struct vfsmount *root_m = BPF_CORE_READ(fs, root.mnt);
	struct dentry *d;
	struct vfsmount *m;
	if (dirfd == -100) { // AT_FDCWD
		d = BPF_CORE_READ(fs, pwd.dentry);
		m = BPF_CORE_READ(fs, pwd.mnt);
	} else {
		struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
		if (!fdt || dirfd < 0 || dirfd >= BPF_CORE_READ(fdt, max_fds))
			return -1;
		struct file **fds = BPF_CORE_READ(fdt, fd);
		struct file *f = 0;
		if (bpf_probe_read_kernel(&f, sizeof(f), &fds[dirfd]) || !f)
			return -1;
		d = BPF_CORE_READ(f, f_path.dentry);
		m = BPF_CORE_READ(f, f_path.mnt);
	}
	// Every step of the walk fills its slot: a name's dentry, or 0 (a
	// mount crossed, or the walk over). Nothing else differs between
	// the paths the verifier explores, so it can prune them.
	__u64 mnt_off = bpf_core_field_offset(struct mount, mnt);
	int top = 0;
	for (int i = 0; i < WALK; i++) {
		__u64 slot = 0;
		if (top) {
		} else if (d == root_d && m == root_m) {
			top = 1;
		} else if (d == BPF_CORE_READ(m, mnt_root)) {
			// The top of a mount: on to where it is mounted.
			struct mount *mnt = (struct mount *)((char *)m - mnt_off);
			struct mount *parent = BPF_CORE_READ(mnt, mnt_parent);
			if (parent == mnt) { // the namespace's root
				top = 1;
			} else {
				d = BPF_CORE_READ(mnt, mnt_mountpoint);
				m = (struct vfsmount *)((char *)parent + mnt_off);
			}
		} else {
			struct dentry *up = BPF_CORE_READ(d, d_parent);
			if (!up || up == d) {
				top = 1;
			} else {
				slot = (__u64)d;
				d = up;
			}
		}
		s->chain[i & (WALK - 1)] = slot;
	}
	if (!top)
		return -1;
	__u32 off = 0;
	for (int i = WALK - 1; i >= 0; i--) {
		struct dentry *c = (struct dentry *)s->chain[i & (WALK - 1)];
		if (!c)
			continue;
		if (off >= PATH_LEN - 2)
			return -1;
		s->buf[in_path(off)] = '/';
		off++;
		const unsigned char *nm = BPF_CORE_READ(c, d_name.name);
		long r = bpf_probe_read_kernel_str(&s->buf[in_path(off)], PATH_LEN, nm);
		if (r <= 1)
			return -1;
		off += r - 1;
	}
	if (off >= PATH_LEN - 2)
		return -1;
	s->buf[in_path(off)] = '/';
	off++;
	long r = bpf_probe_read_user_str(&s->buf[in_path(off)], PATH_LEN, (const void *)name);
	if (r <= 0)
		return -1;
	off += r - 1;
	if (off >= PATH_LEN)
		return -1;
	return off;
}

// read_path puts the path argument at user address name into out
// (PATH_LEN bytes): resolved against dir (DIR_CWD, or the fd dirfd) when
// relative, as given otherwise.
static __always_inline void read_path(char *out, __u64 name, int dir, __s64 dirfd) {
	char first = 0;
	if (bpf_probe_read_user(&first, 1, (const void *)name))
		return;
	if (dir != DIR_RAW && first != '/' && first != 0) {
		int n = resolve_path(name, dir == DIR_CWD ? -100 : dirfd);
		__u32 zero = 0;
		struct path_scratch *s = bpf_map_lookup_elem(&path_scratch, &zero);
		if (n > 0 && s) {
			bpf_probe_read_kernel(out, PATH_LEN, s->buf);
			out[PATH_LEN - 1] = 0;
			return;
		}
	}
	bpf_probe_read_user_str(out, PATH_LEN, (const void *)name);
}

// arg returns args[i] (0 ≤ i < 5; else 0). A switch: the verifier
// refuses a read of the stack at a variable offset.
static __always_inline __u64 arg(__u64 *a, int i) {
	switch (i) {
	case 0:
		return a[0];
	case 1:
		return a[1];
	case 2:
		return a[2];
	case 3:
		return a[3];
	case 4:
		return a[4];
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret) {
	__u32 nr = (__u32)BPF_CORE_READ(regs, orig_ax);
	struct syscall_spec *sp = bpf_map_lookup_elem(&syscalls, &nr);
	if (!sp || !sp->when)
		return 0;
	__u64 cg = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&watched, &cg))
		return 0;
	struct syscall_spec spec = *sp;
	__u64 a[5] = {BPF_CORE_READ(regs, di), BPF_CORE_READ(regs, si), BPF_CORE_READ(regs, dx), BPF_CORE_READ(regs, r10), BPF_CORE_READ(regs, r8)};
	if (spec.when == WHEN_WRITE && !(arg(a, spec.flags) & 01103)) // O_WRONLY|O_RDWR|O_CREAT|O_TRUNC
		return 0;
	if (spec.when == WHEN_FAILED && ret >= 0)
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
	e->args[0] = a[0];
	e->args[1] = a[1];
	e->args[2] = a[2];
	// A directory fd is an int: the upper half of its register is not
	// part of it (AT_FDCWD may come zero-extended).
	if (spec.path >= 0)
		read_path(e->path, arg(a, spec.path), spec.dir, (__s32)arg(a, spec.dir));
	if (spec.path2 >= 0)
		read_path(e->aux, arg(a, spec.path2), spec.dir2, (__s32)arg(a, spec.dir2));
	if (spec.addr >= 0) {
		__u64 len = arg(a, spec.addr + 1);
		__u32 n = len > 28 ? 28 : (__u32)len;
		bpf_probe_read_user(e->path, n & 31, (const void *)arg(a, spec.addr));
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
