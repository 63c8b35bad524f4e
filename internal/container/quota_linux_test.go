package container

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// TestKernelQuotasPerSandbox checks that the kernel's per-user counts
// are each sandbox's own: a sandbox that uses up its inotify instances
// (fs.inotify.max_user_instances) and its POSIX message queue bytes
// (RLIMIT_MSGQUEUE) leaves a neighbour sandbox and host root able to
// make both, and the monitor reports the refusals. With every sandbox's
// user namespace owned by host root, all of them and host root drew on
// one budget: the neighbour and the host got EMFILE.
func TestKernelQuotasPerSandbox(t *testing.T) {
	world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	_, netRange := names(dir)
	rec, log := startAudit(t, netRange)
	rt := newRuntime(t, dir, runtimeOptions{monitor: rec})
	e := newIsoEnv(t, rt)
	e.audit = log
	hog, neighbour := e.create(t, "quota-hog", nil), e.create(t, "quota-neighbour", nil)

	// Each sandbox's user namespace has an owner of its own among the
	// node's ids: not host root, not another sandbox's.
	owners := map[int]string{}
	for _, sb := range []*Sandbox{hog, neighbour} {
		o, err := sys.UserNSOwner(sb.state.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if o <= rt.opt.HostUID || o >= rt.opt.HostUID+rt.opt.IDCount || o != sb.state.Owner {
			t.Errorf("%s's user namespace is owned by uid %d (recorded: %d), want one of the node's ids %d–%d",
				sb.id, o, sb.state.Owner, rt.opt.HostUID+1, rt.opt.HostUID+rt.opt.IDCount-1)
		}
		if other, dup := owners[o]; dup {
			t.Errorf("%s and %s share the owner %d", sb.id, other, o)
		}
		owners[o] = sb.id
	}

	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		t.Fatal(err)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The hog takes every inotify instance it can and keeps them (a
	// sleep holds them), and makes message queues until refused.
	// (Its budget is max_user_instances, less what another runtime's
	// sandbox with the same owner holds: other test processes of this
	// package hand out the same owners.)
	got := probeIn(t, hog, "inotify", strconv.Itoa(limit+16), "hold")
	if n, _ := strconv.Atoi(got.get(t, "inotify")); n == 0 || n > limit || got.get(t, "err") != "EMFILE" {
		t.Errorf("the hog's inotify instances: %v, want up to %d, then EMFILE", got, limit)
	}
	queues := probeIn(t, hog, "mqueue", "1000", "hold")
	if n, _ := strconv.Atoi(queues.get(t, "mqueue")); n == 0 || queues.get(t, "err") != "EMFILE" {
		t.Errorf("the hog's message queues: %v, want some, then EMFILE (RLIMIT_MSGQUEUE)", queues)
	}
	t.Logf("the hog holds %s inotify instances and %s message queues", got.get(t, "inotify"), queues.get(t, "mqueue"))

	// The neighbour and host root still make both.
	for _, c := range []struct {
		where string
		got   kv
	}{
		{"the neighbour sandbox", probeIn(t, neighbour, "inotify", "1")},
		{"the neighbour sandbox", probeIn(t, neighbour, "mqueue", "1")},
		{"host root", e.hostProbe(t, nil, "inotify", "1")},
		{"host root", e.hostProbe(t, nil, "mqueue", "1")},
	} {
		if c.got["err"] != "OK" {
			t.Errorf("%s, while the hog holds its quota: %v, want OK", c.where, c.got)
		}
	}
	// What the hog holds goes with it (before the checks above, held
	// by host root's budget, it starved the whole host).
	run(t, hog, "kill", got.get(t, "held"))

	// The refusals are audited; the neighbour's calls succeeded and hit
	// no rule.
	for _, sc := range []string{"inotify_init1", "mq_open"} {
		e.auditedWhere(t, hog, "kernel-quota-exhausted", "failed", sc+" EMFILE", func(ev api.AuditEvent) bool {
			return ev.Syscall == sc && ev.Result == -24
		})
	}
	e.notHit(t, neighbour, "kernel-quota-exhausted")
}

// TestNodeForksOwnedSandboxes checks the node's own forks (no zygote):
// the forker thread gives the sandbox's user namespace its owner and
// sets its open files limit as that owner, and goes back to root.
func TestNodeForksOwnedSandboxes(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{noZygote: true})
	var sbs []*Sandbox
	for _, id := range []string{"forked1", "forked2"} {
		sbs = append(sbs, createIn(t, rt, sandbox.Spec{ID: id, Image: w.image()}, nil))
	}
	for _, sb := range sbs {
		if o, err := sys.UserNSOwner(sb.state.Pid); err != nil || o != sb.state.Owner || o <= rt.opt.HostUID {
			t.Errorf("%s's user namespace is owned by %d (%v), want its own owner %d", sb.id, o, err, sb.state.Owner)
		}
		if res := run(t, sb, "sh", "-c", "ulimit -n; ulimit -Hn"); res.Stdout != fmt.Sprintf("%d\n%d\n", rt.opt.Nofile, rt.opt.Nofile) {
			t.Errorf("%s's open files limits: %+v, want %d", sb.id, res, rt.opt.Nofile)
		}
	}
	if sbs[0].state.Owner == sbs[1].state.Owner {
		t.Errorf("both sandboxes are owned by %d", sbs[0].state.Owner)
	}
	rt.zmu.Lock()
	z := rt.zygote
	rt.zmu.Unlock()
	if z != nil {
		t.Error("a zygote runs")
	}
	// The forker threads are root again (and in the host's network).
	rt.forker.mu.Lock()
	tids := slices.Clone(rt.forker.tids)
	rt.forker.mu.Unlock()
	for _, tid := range tids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "Uid:\t0\t0\t0\t0\n") {
			t.Errorf("forker thread %d after the forks:\n%s", tid, b)
		}
	}
}
