package container

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// endLog collects what a runtime reports through OnEnd.
type endLog chan sandbox.Ended

func watchEnds(rt *Runtime) endLog {
	l := make(endLog, 64)
	rt.OnEnd(func(e sandbox.Ended) { l <- e })
	return l
}

// wait returns the end reported for id, failing the test if none comes
// within d; ends of other sandboxes are put back.
func (l endLog) wait(t *testing.T, id string, d time.Duration) sandbox.Ended {
	t.Helper()
	timeout := time.After(d)
	var others []sandbox.Ended
	defer func() {
		for _, e := range others {
			l <- e
		}
	}()
	for {
		select {
		case e := <-l:
			if e.ID == id {
				return e
			}
			others = append(others, e)
		case <-timeout:
			t.Fatalf("no end of %s reported within %v", id, d)
			return sandbox.Ended{}
		}
	}
}

// none fails the test if an end of id is reported within d.
func (l endLog) none(t *testing.T, id string, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	var others []sandbox.Ended
	defer func() {
		for _, e := range others {
			l <- e
		}
	}()
	for {
		select {
		case e := <-l:
			if e.ID == id {
				t.Errorf("%s was reported ended: %+v", id, e)
				return
			}
			others = append(others, e)
		case <-timeout:
			return
		}
	}
}

// released fails the test if anything of the sandbox sb is left: its
// directory, its cgroups (by name: a recycled group is renamed), its
// place in the runtime; and a call to it must say it is gone.
func released(t *testing.T, rt *Runtime, sb *Sandbox, dirs []string) {
	t.Helper()
	for _, d := range append([]string{sb.dir}, dirs...) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after its sandbox ended (%v)", d, err)
		}
	}
	rt.mu.Lock()
	_, there := rt.sandboxes[sb.id]
	rt.mu.Unlock()
	if there {
		t.Errorf("the runtime still has %s", sb.id)
	}
	if _, err := sb.Exec(context.Background(), sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("exec in the ended sandbox: %v, want sandbox_not_found", err)
	}
}

// memoryGroup is sb's v1 memory group directory ("" on v2).
func memoryGroup(sb *Sandbox) string {
	for _, d := range sb.cg.Dirs() {
		if strings.Contains(d, "/memory/") {
			return d
		}
	}
	return ""
}

// TestAgentLiveness: the attacks that disabled a sandbox's agent from
// inside (its limits set by sandbox root through prlimit, which shares
// its uid; the sandbox's memory filled until the OOM killer chose the
// agent) no longer do, each beside a control where the defence is absent
// and the agent stalls or dies; and an agent that dies anyway is noticed
// at once: the runtime releases the sandbox, records a sandbox-ended
// audit event and reports the end (OnEnd) with how it came.
func TestAgentLiveness(t *testing.T) {
	world.get(t)
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	_, netRange := names(dir)
	rec, log := startAudit(t, append(hostPrefixes(t), netRange, netip.PrefixFrom(network.DefaultGateway, 32))...)
	rt := newRuntime(t, dir, runtimeOptions{monitor: rec})
	ends := watchEnds(rt.Runtime)
	e := newIsoEnv(t, rt)
	e.audit = log
	// The controls' runtime installs no seccomp filter.
	noSecDir := t.TempDir()
	t.Cleanup(func() { checkHost(t, noSecDir) })
	noSec := newRuntime(t, noSecDir, runtimeOptions{noSeccomp: true, monitor: rec})
	noSecEnds := watchEnds(noSec.Runtime)
	alive := func(t *testing.T, sb *Sandbox) {
		t.Helper()
		for range 3 {
			if res := run(t, sb, "echo", "alive"); res.Stdout != "alive\n" {
				t.Fatalf("the agent of %s: %+v", sb.id, res)
			}
		}
	}
	// endedAudit waits for sb's sandbox-ended audit event of end.
	endedAudit := func(t *testing.T, sb *Sandbox, end sandbox.Ended) {
		t.Helper()
		e.auditedWhere(t, sb, "sandbox-ended", "failed", "the agent's end", func(ev api.AuditEvent) bool {
			return ev.Kind == "sandbox-ended" && ev.Detail == end.Reason() && int(ev.Pid) == end.Pid && ev.Result == int64(end.Status)
		})
	}

	t.Run("prlimit_on_the_agent", func(t *testing.T) {
		sb := e.create(t, "live-rlimit", nil)
		// Every thread of the agent: limits are per process, set through
		// any of its threads' ids.
		res := run(t, sb, sh(`for t in $(ls /proc/1/task); do
			`+probePath+` sys prlimit=$t,nofile,3 prlimit=$t,cpu,0 prlimit=$t,nproc,0 prlimit=$t,as,1048576
		done; `+probePath+` sys prlimit-get=1 prlimit=0,nofile,1024`)...)
		got := parseKV(res.Stdout)
		n := 0
		for k, v := range got {
			if strings.HasPrefix(k, "prlimit:") && !strings.HasPrefix(k, "prlimit:0,") {
				n++
				if v != "EPERM" {
					t.Errorf("%s = %s, want EPERM", k, v)
				}
			}
		}
		if n < 4*4 {
			t.Errorf("%d prlimit calls on the agent's threads: %q", n, res.Stdout)
		}
		expect(t, "sandbox", got, map[string][]string{"prlimit-get:1": {"OK"}, "prlimit:0,nofile,1024": {"OK"}})
		time.Sleep(1500 * time.Millisecond) // RLIMIT_CPU 0 would have killed it by now
		alive(t, sb)
		ends.none(t, sb.id, 100*time.Millisecond)
		e.audited(t, sb, "rlimit-refused", "denied", "prlimit64")

		// Controls, without the filter: RLIMIT_NOFILE 3 leaves the agent
		// alive and unable to start a command…
		nofile := createIn(t, noSec, sandbox.Spec{ID: "live-nofile-ctl", Image: e.img}, nil)
		expect(t, "no seccomp (control)", probeIn(t, nofile, "sys", "prlimit=1,nofile,3"), map[string][]string{"prlimit:1,nofile,3": {"OK"}})
		if res, err := nofile.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}, TimeoutS: 10}}); err == nil {
			t.Errorf("control: a command ran in a sandbox whose agent has RLIMIT_NOFILE 3: %+v", res)
		}
		// …and RLIMIT_CPU 0 kills it: the end is noticed and reported.
		cpu := createIn(t, noSec, sandbox.Spec{ID: "live-cpu-ctl", Image: e.img}, nil)
		dirs := cpu.cg.Dirs()
		// The limit may end the agent before it answers (on a loaded
		// host the tick can come at once): the end below is the check.
		_, _ = cpu.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{probePath, "sys", "prlimit=1,cpu,0"}, TimeoutS: 10}})
		// The kernel checks the limit on a timer tick that finds the
		// agent running: commands make it run until one does.
		go func() {
			for i := 0; i < 1000; i++ {
				if _, err := cpu.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}, TimeoutS: 10}}); err != nil {
					return
				}
			}
		}()
		end := noSecEnds.wait(t, cpu.id, 30*time.Second)
		if end.Code != sandbox.EndAgentExited || !strings.Contains(end.Detail, "killed by SIGKILL") {
			t.Errorf("control: the end of an agent at RLIMIT_CPU 0: %+v", end)
		}
		released(t, noSec.Runtime, cpu, dirs)
		endedAudit(t, cpu, end)
	})

	t.Run("memory_full", func(t *testing.T) {
		sb := e.create(t, "live-oom", func(s *sandbox.Spec) { s.MemoryMB = 64 })
		// A file on the upper (a tmpfs, charged to the writer) to past
		// the limit: it counts in no process's memory, so the agent was
		// the largest task left for the OOM killer.
		if res := run(t, sb, sh(`dd if=/dev/zero of=/tmp/fill bs=1M count=128 2>/dev/null; echo rc=$?`)...); res.Stdout != "rc=137\n" {
			t.Errorf("128 MiB written under a 64 MiB limit: %+v, want dd killed", res)
		}
		alive(t, sb)
		run(t, sb, "rm", "-f", "/tmp/fill")
		// Many small processes, 40 × (2 MiB + the probe's runtime).
		got := probeIn(t, sb, "hogs", "40", "2")
		if k, _ := strconv.Atoi(got.get(t, "killed")); k < 1 || got.get(t, "started") != "40" {
			t.Errorf("40 hogs in 64 MiB: %v, want some killed", got)
		}
		alive(t, sb)
		if st, err := sb.Stats(ctx); err != nil || st.OOMKills < 2 {
			t.Errorf("stats after the OOM kills: %+v, %v", st, err)
		}
		ends.none(t, sb.id, 100*time.Millisecond)
		e.auditedWhere(t, sb, "oom-kill", "", "a command killed", func(ev api.AuditEvent) bool { return ev.Kind == "oom-kill" && ev.Comm != "dsec-guest" })
		if e.hasEvent(sb, func(ev api.AuditEvent) bool { return ev.Kind == "oom-kill" && int(ev.Pid) == sb.state.Pid }) {
			t.Errorf("the OOM killer chose the agent of %s", sb.id)
		}

		// Control: the agent's fork thread back in the sandbox's memory
		// group (as before the commands group), the same file: the OOM
		// killer chooses the agent. The end says so.
		mem := memoryGroup(sb)
		if mem == "" {
			t.Skip("no v1 memory group: no commands group to take away")
		}
		ctl := e.create(t, "live-oom-ctl", func(s *sandbox.Spec) { s.MemoryMB = 64 })
		tid, err := forkThread(ctl.state.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(memoryGroup(ctl), "tasks"), []byte(strconv.Itoa(tid)), 0); err != nil {
			t.Fatal(err)
		}
		dirs := ctl.cg.Dirs()
		_, _ = ctl.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`dd if=/dev/zero of=/tmp/fill bs=1M count=128`), TimeoutS: 30}})
		end := ends.wait(t, ctl.id, 15*time.Second)
		if end.Code != sandbox.EndAgentExited || !strings.Contains(end.Detail, "OOM killer") {
			t.Errorf("control: the end of an agent the OOM killer chose: %+v", end)
		}
		released(t, rt.Runtime, ctl, dirs)
		endedAudit(t, ctl, end)
	})

	t.Run("killed", func(t *testing.T) {
		sb := e.create(t, "live-kill", nil)
		dirs := sb.cg.Dirs()
		pid := sb.state.Pid
		start := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		end := ends.wait(t, sb.id, 10*time.Second)
		took := time.Since(start)
		t.Logf("the end reported %v after the kill, the sandbox released: %+v", took, end)
		// Seen in microseconds; the release (cgroups, network) takes
		// milliseconds, more on a busy host.
		if took > 3*time.Second {
			t.Errorf("the end was reported %v after the agent's kill", took)
		}
		if end.Code != sandbox.EndAgentExited || end.Detail != "killed by SIGKILL" || end.Pid != pid || end.Status != int(syscall.SIGKILL) {
			t.Errorf("end %+v, want agent_exited, killed by SIGKILL, pid %d, status 9", end, pid)
		}
		released(t, rt.Runtime, sb, dirs)
		endedAudit(t, sb, end)

		// A Destroy is no end.
		gone := e.create(t, "live-destroyed", nil)
		if err := gone.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		ends.none(t, gone.id, 500*time.Millisecond)
	})

	t.Run("adopted", func(t *testing.T) {
		// A sandbox a restarted node adopted is watched as well.
		rdir := t.TempDir()
		t.Cleanup(func() { checkHost(t, rdir) })
		first := newRuntime(t, rdir, runtimeOptions{})
		if _, err := first.Create(ctx, sandbox.Spec{ID: "live-adopted", Image: e.img}); err != nil {
			t.Fatal(err)
		}
		if err := first.Close(ctx); err != nil {
			t.Fatal(err)
		}
		second := newRuntime(t, rdir, runtimeOptions{})
		secondEnds := watchEnds(second.Runtime)
		sbs, err := second.Recover(ctx)
		for _, sb := range sbs {
			t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		}
		if err != nil || len(sbs) != 1 {
			t.Fatalf("Recover: %d sandboxes, %v", len(sbs), err)
		}
		sb := sbs[0].(*Sandbox)
		dirs := sb.cg.Dirs()
		if err := syscall.Kill(sb.state.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		end := secondEnds.wait(t, sb.id, 10*time.Second)
		// Its parent, the first runtime's zygote, is gone: init reaps
		// it, maybe after the runtime looked for its status.
		if end.Code != sandbox.EndAgentExited || end.Detail != "killed by SIGKILL" && !strings.HasPrefix(end.Detail, "it is gone") {
			t.Errorf("end of an adopted sandbox's agent: %+v", end)
		}
		released(t, second.Runtime, sb, dirs)
	})
}
