package vmtier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// TestAdversarial runs the hostile-task catalogue's microvm subset on one
// VM, one subtest each, in an order that keeps the VM usable until the
// last: a PTY with resize (the guest has devpts), file API escapes,
// output and console floods, memory exhaustion in the guest, then a fork
// bomb and a prompt Destroy. Each asserts the safe outcome and has a
// control showing the check could fail.
func TestAdversarial(t *testing.T) {
	rt, dir := newRuntime(t)
	ctx := ctxT(t, 8*time.Minute)
	const memMiB = 256
	spec := busyboxSpec("mvm-adv", Tier)
	spec.MemoryMB = memMiB
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	msb := sb.(*Sandbox)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			sb.Destroy(context.Background())
		}
	})
	execReq := func(t *testing.T, req api.ExecRequest) api.ExecResult {
		t.Helper()
		if req.TimeoutS == 0 {
			req.TimeoutS = 30
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: req})
		if err != nil {
			t.Fatalf("Exec %q: %v", req.Cmd, err)
		}
		return res
	}
	run := func(t *testing.T, script string) api.ExecResult {
		t.Helper()
		return execReq(t, api.ExecRequest{Cmd: sh(script)})
	}
	// responsive times an echo through the agent.
	responsive := func(t *testing.T) time.Duration {
		t.Helper()
		s := time.Now()
		if res := run(t, "echo ok"); res.Stdout != "ok\n" {
			t.Errorf("echo ok: %+v", res)
		}
		return time.Since(s)
	}

	t.Run("PTY", func(t *testing.T) {
		p, err := msb.StartPTY(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`tty; stty size; touch /tmp/pty-sized; read x; stty size`)}}, 24, 80)
		if err != nil {
			t.Fatalf("StartPTY: %v", err)
		}
		// Control: the size before the resize is the one started with
		// (the resize waits until the guest has read it: a fixed pause
		// was too short for TCG on a loaded host).
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := msb.Files().Stat(ctx, "/tmp/pty-sized"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the PTY's command did not read its size within a minute")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := p.(agentsandbox.Process).Resize(ctx, 40, 100); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		if err := p.WriteStdin(ctx, []byte("\n")); err != nil {
			t.Fatalf("WriteStdin: %v", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		res, err := p.Wait(wctx)
		if err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "/dev/pts/") || !strings.Contains(res.Stdout, "24 80") || !strings.Contains(res.Stdout, "40 100") {
			t.Errorf("PTY: %+v, %v; want a /dev/pts terminal sized 24 80, then 40 100", res, err)
		}
	})

	t.Run("FilesEscape", func(t *testing.T) {
		// A marker on the host, under a name the guest also has once the
		// control writes it: no path reaches the host's.
		var b [8]byte
		rand.Read(b[:])
		name := "dsec-adv-" + hex.EncodeToString(b[:])
		secret := "HOST-SECRET-" + hex.EncodeToString(b[:])
		hostFile := filepath.Join("/tmp", name)
		if err := os.WriteFile(hostFile, []byte(secret), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(hostFile) })
		run(t, fmt.Sprintf(`ln -s /tmp/%[1]s /workspace/abs; ln -s /proc/1/root/tmp/%[1]s /workspace/proc1; ln -s /proc/self/root /workspace/selfroot; ln -s ../../../../../../tmp/%[1]s /workspace/rel`, name))
		paths := []string{
			"/../../../../tmp/" + name, "../../../tmp/" + name, "/tmp/" + name,
			"/workspace/abs", "/workspace/proc1", "/workspace/selfroot/tmp/" + name, "/workspace/rel",
			"/proc/1/root/tmp/" + name, "/proc/self/root/tmp/" + name, "/proc/self/cwd/../../../tmp/" + name,
		}
		read := func(p string) (string, error) {
			rc, _, err := sb.Files().Open(ctx, p)
			if err != nil {
				return "", err
			}
			defer rc.Close()
			got, err := io.ReadAll(rc)
			return string(got), err
		}
		check := func(guest bool) int {
			reached := 0
			for _, p := range paths {
				got, err := read(p)
				if strings.Contains(got, secret) {
					t.Errorf("Open(%q) read the host's marker", p)
				}
				if got == "GUEST\n" {
					reached++
				}
				if !guest && err == nil {
					t.Errorf("Open(%q) before the guest has the file = %q", p, got)
				}
				if guest {
					t.Logf("files API Open(%q): %q, %v", p, got, err)
				}
			}
			return reached
		}
		if n := check(false); n != 0 {
			t.Errorf("%d paths read a guest file before it existed", n)
		}
		// Control: with the file in the guest, every one of these paths
		// leads to it inside the guest (the files API reaches it or
		// refuses the path; it never leads out of the guest).
		run(t, "echo GUEST > /tmp/"+name)
		if n := check(true); n < 1 {
			t.Errorf("control: the files API reached the guest's /tmp/%s by no path", name)
		}
		for _, p := range paths {
			if res := execReq(t, api.ExecRequest{Cmd: []string{"sh", "-c", `cd /workspace && cat "$1"`, "sh", p}}); res.Stdout != "GUEST\n" {
				t.Errorf("control: cat %q in the guest: %+v", p, res)
			}
		}
	})

	t.Run("OutputFlood", func(t *testing.T) {
		const limit = 1 << 20
		// Control: output under the cap is whole.
		if res := execReq(t, api.ExecRequest{Cmd: sh(`head -c 1000 /dev/zero | tr '\0' y`), MaxOutputBytes: limit}); len(res.Stdout) != 1000 || res.StdoutTruncated {
			t.Errorf("control: 1000 bytes: %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
		var streamed atomic.Int64
		var wg sync.WaitGroup
		var flood api.ExecResult
		var floodErr error
		s := time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			flood, floodErr = sb.Exec(ctx, sandbox.ExecRequest{
				ExecRequest: api.ExecRequest{Cmd: sh(`head -c 64000000 /dev/zero | tr '\0' y; echo err >&2`), MaxOutputBytes: limit, TimeoutS: 60},
				Stdout:      writerFunc(func(p []byte) { streamed.Add(int64(len(p))) }),
			})
		}()
		time.Sleep(500 * time.Millisecond)
		during := responsive(t)
		testenv.WaitGroup(t, &wg, 5*time.Minute, "the output flood's exec")
		t.Logf("64 MB of output: %v; echo during it: %v; streamed %d bytes", time.Since(s).Round(time.Millisecond), during.Round(time.Millisecond), streamed.Load())
		if floodErr != nil || !flood.StdoutTruncated || len(flood.Stdout) > limit || streamed.Load() > limit {
			t.Errorf("flood: err %v, truncated %v, captured %d, streamed %d; want capped at %d", floodErr, flood.StdoutTruncated, len(flood.Stdout), streamed.Load(), limit)
		}
		if during > 10*time.Second {
			t.Errorf("an exec took %v during the flood", during)
		}
	})

	t.Run("ConsoleFlood", func(t *testing.T) {
		logPath := filepath.Join(msb.RunDir(), vmm.SerialLog)
		size := func() int64 {
			var n int64
			for _, p := range []string{logPath, logPath + ".1"} {
				if fi, err := os.Stat(p); err == nil {
					n += fi.Size()
				}
			}
			return n
		}
		before := size()
		var wg sync.WaitGroup
		var flood api.ExecResult
		wg.Add(1)
		s := time.Now()
		go func() {
			defer wg.Done()
			flood = execReq(t, api.ExecRequest{Cmd: sh(`head -c 2000000 /dev/zero | tr '\0' A > /dev/ttyS0; head -c 500000 /dev/zero | tr '\0' B > /dev/console; echo done`), TimeoutS: 40})
		}()
		time.Sleep(time.Second)
		during := responsive(t)
		testenv.WaitGroup(t, &wg, 5*time.Minute, "the console flood's exec")
		after := size()
		t.Logf("console flood: %v (%s); echo during it: %v; host log %d → %d bytes (cap %d)", time.Since(s).Round(time.Millisecond), strings.TrimSpace(flood.Stdout), during.Round(time.Millisecond), before, after, vmm.DefaultSerialLogMax)
		if after > vmm.DefaultSerialLogMax+4096 {
			t.Errorf("the host's console log grew to %d bytes, past its cap %d", after, vmm.DefaultSerialLogMax)
		}
		// Control: the flood reached the host's log (it rotated, and
		// holds the guest's bytes).
		tail, _ := os.ReadFile(logPath + ".1")
		if _, err := os.Stat(logPath + ".1"); err != nil || !strings.Contains(string(tail), strings.Repeat("A", 1000)) && !strings.Contains(string(tail), strings.Repeat("B", 1000)) {
			t.Errorf("control: the flood did not reach the host's log (rotated: %v)", err)
		}
		if during > 10*time.Second {
			t.Errorf("an exec took %v during the console flood", during)
		}
	})

	t.Run("MemoryExhaustion", func(t *testing.T) {
		u0, err := msb.vm.Usage()
		if err != nil {
			t.Fatal(err)
		}
		// Doubling a string until the guest's OOM killer ends it.
		res := execReq(t, api.ExecRequest{Cmd: sh(`awk 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'`), TimeoutS: 120})
		u1, err := msb.vm.Usage()
		if err != nil {
			t.Fatalf("QEMU after the guest's OOM: %v", err)
		}
		t.Logf("awk: exit %d in %.0f ms; QEMU RSS %d → %d MiB (peak %d MiB), guest memory %d MiB", res.ExitCode, res.DurationMS, u0.RSSBytes>>20, u1.RSSBytes>>20, u1.PeakRSSBytes>>20, memMiB)
		if res.ExitCode == 0 || res.TimedOut {
			t.Errorf("the memory hog: %+v; want killed", res)
			t.Logf("the guest's memory: %+v", run(t, `cat /proc/meminfo /proc/pressure/memory; dmesg | tail -20`))
		}
		// The guest's guard against thrashing (a hog whose pages push out
		// its own text would otherwise be refaulted for minutes) is on.
		g := run(t, `cat /sys/kernel/mm/lru_gen/enabled /sys/kernel/mm/lru_gen/min_ttl_ms`)
		if f := strings.Fields(g.Stdout); len(f) == 0 || f[len(f)-1] != "1000" || f[0] == "0x0000" {
			t.Errorf("the guest's thrashing guard: %+v; want MGLRU on with min_ttl_ms 1000", g)
		}
		// Control: it was the guest's OOM killer, and the guest touched
		// the memory (QEMU's RSS grew).
		if k := run(t, `dmesg | grep -ci 'out of memory\|oom-kill'`); strings.TrimSpace(k.Stdout) == "0" {
			t.Errorf("control: no OOM kill in the guest's log: %+v", k)
		}
		if u1.PeakRSSBytes-u0.RSSBytes < 32<<20 {
			t.Errorf("control: QEMU's RSS grew by %d MiB only", (u1.PeakRSSBytes-u0.RSSBytes)>>20)
		}
		// Bounded: guest memory plus QEMU's own (TCG's code cache
		// included).
		if bound := int64(memMiB+512) << 20; u1.PeakRSSBytes > bound {
			t.Errorf("QEMU's peak RSS %d MiB is past guest memory + 512 MiB", u1.PeakRSSBytes>>20)
		}
		responsive(t)
		st, err := sb.Stats(ctx)
		if err != nil || st.HostMemoryBytes == 0 || st.CPUSeconds == 0 || st.MemoryLimitBytes == 0 {
			t.Errorf("Stats after the OOM: %+v, %v", st, err)
		}
		t.Logf("Stats: %+v", st)
	})

	t.Run("ForkBomb", func(t *testing.T) {
		st0, err := sb.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Commands run in the guest's commands cgroup, whose pids.max
		// leaves the agent room under the guest's threads-max.
		if res := run(t, `cat /proc/self/cgroup; cat /sys/fs/cgroup/commands/pids.max /proc/sys/kernel/threads-max`); !strings.HasPrefix(res.Stdout, "0::/commands\n") {
			t.Errorf("the commands' cgroup: %+v", res)
		} else {
			t.Logf("commands' cgroup, pids.max and threads-max: %q", res.Stdout)
		}
		hostBefore := len(hostPids())
		qemuBefore := tasks(msb.Pid())
		pr := sb.(sandbox.ProcessRunner)
		if _, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`f() { f | f & }; f >/dev/null 2>&1`), TimeoutS: 600}}); err != nil {
			t.Fatalf("StartProcess: %v", err)
		}
		// Control: the bomb runs (the guest's process count climbs).
		var guestMax int
		var hostMax, qemuMax int
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := sb.Stats(sctx)
			cancel()
			if err == nil {
				guestMax = max(guestMax, st.Processes)
			}
			hostMax = max(hostMax, len(hostPids()))
			qemuMax = max(qemuMax, tasks(msb.Pid()))
			if guestMax > st0.Processes+300 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The node stays responsive: the host runs a program promptly.
		s := time.Now()
		if err := exec.Command("true").Run(); err != nil {
			t.Error(err)
		}
		hostExec := time.Since(s)
		t.Logf("fork bomb: guest processes %d → up to %d; host pids %d → max %d; QEMU threads %d → max %d; host exec %v", st0.Processes, guestMax, hostBefore, hostMax, qemuBefore, qemuMax, hostExec.Round(time.Millisecond))
		if guestMax < st0.Processes+50 {
			t.Errorf("control: the guest's process count went from %d to %d only", st0.Processes, guestMax)
		}
		if qemuMax > qemuBefore+64 || hostMax > hostBefore+guestMax/2 && hostMax > hostBefore+300 {
			t.Errorf("the bomb reached the host: QEMU threads %d → %d, host pids %d → %d", qemuBefore, qemuMax, hostBefore, hostMax)
		}
		if hostExec > 2*time.Second {
			t.Errorf("a host program took %v during the bomb", hostExec)
		}
		if _, err := msb.vm.Usage(); err != nil {
			log, _ := os.ReadFile(filepath.Join(msb.RunDir(), vmm.SerialLog))
			if len(log) > 3000 {
				log = log[len(log)-3000:]
			}
			t.Errorf("QEMU exited during the bomb (%v); console tail:\n%s", err, log)
		} else {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := sb.Stats(sctx)
			cancel()
			if err != nil {
				t.Errorf("the agent does not answer during the bomb: %v", err)
			}
		}
		s = time.Now()
		if err := sb.Destroy(ctx); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		destroyed = true
		took := time.Since(s)
		t.Logf("destroy during the bomb: %v", took.Round(time.Millisecond))
		if took > 15*time.Second {
			t.Errorf("Destroy took %v", took)
		}
		if ps := qemuProcs(dir); len(ps) > 0 {
			t.Errorf("QEMU left after Destroy: %+v", ps)
		}
	})
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// hostPids lists the host's processes.
func hostPids() []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if c := e.Name()[0]; c >= '0' && c <= '9' {
			out = append(out, e.Name())
		}
	}
	return out
}

// tasks counts pid's threads.
func tasks(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return len(ents)
}
