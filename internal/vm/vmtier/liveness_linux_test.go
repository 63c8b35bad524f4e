package vmtier

import (
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// events is a recorder that keeps what it is given.
type events struct {
	mu  sync.Mutex
	evs []monitor.Event
}

func (e *events) Record(id, phase string, ev monitor.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev.Path = id + " " + ev.Path // the sandbox, for the test
	e.evs = append(e.evs, ev)
}

func (e *events) ended(id string) (monitor.Event, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.evs {
		if ev.Kind == monitor.KindSandboxEnded && strings.HasPrefix(ev.Path, id+" ") {
			return ev, true
		}
	}
	return monitor.Event{}, false
}

// waitEnd returns the end reported on ch for id within d.
func waitEnd(t *testing.T, ch <-chan sandbox.Ended, id string, d time.Duration) sandbox.Ended {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case e := <-ch:
			if e.ID == id {
				return e
			}
		case <-timeout:
			t.Fatalf("no end of %s reported within %v", id, d)
		}
	}
}

// TestVMEndsByItself: a jailed VM whose QEMU is killed, and an adopted
// one (a node restart) whose guest reboots, are reported ended (OnEnd)
// with how, recorded (a sandbox-ended event with QEMU's jail uid) and
// released: no QEMU, run directory or cgroup is left (jailedRuntime's
// cleanup checks). TestSandboxEndedMicroVM (internal/daemon) does a
// guest's panic and power-off through the API. Two boots.
func TestVMEndsByItself(t *testing.T) {
	rt, cg := jailedRuntime(t, vmm.MicroVM, "")
	rec := &events{}
	rt.opt.Audit = rec
	ends := make(chan sandbox.Ended, 8)
	rt.OnEnd(func(e sandbox.Ended) { ends <- e })
	ctx := ctxT(t, 5*time.Minute)

	sb, err := rt.Create(ctx, busyboxSpec("mvm-killed", Tier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	s := sb.(*Sandbox)
	pid, dir := s.Pid(), s.RunDir()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	end := waitEnd(t, ends, s.id, 10*time.Second)
	if end.Code != sandbox.EndVMMExited || end.Detail != "QEMU was killed by SIGKILL" || end.Pid != pid {
		t.Errorf("end of a killed QEMU: %+v", end)
	}
	if ev, ok := rec.ended(s.id); !ok || ev.Detail != end.Reason() || ev.UID < testUIDBase || !strings.Contains(ev.Path, "qemu") {
		t.Errorf("its audit event: %+v (%v)", ev, ok)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("its run directory: %v", err)
	}
	if names, _ := cg.List(); len(names) > 0 {
		t.Errorf("its cgroups: %v", names)
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"true"}}}); err == nil {
		t.Error("an exec in the ended sandbox ran")
	}

	// Adopted by a restarted runtime, watched all the same.
	sb, err = rt.Create(ctx, busyboxSpec("mvm-adopted", Tier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	rt.Close(ctx)
	rt2, err := New(ctx, rt.opt)
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close(ctx)
	ends2 := make(chan sandbox.Ended, 8)
	rt2.OnEnd(func(e sandbox.Ended) { ends2 <- e })
	got, err := rt2.Recover(ctx)
	for _, a := range got {
		defer a.Destroy(ctx)
	}
	if err != nil || len(got) != 1 {
		t.Fatalf("Recover: %d sandboxes, %v", len(got), err)
	}
	_, _ = got[0].Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"reboot", "-f"}}})
	end = waitEnd(t, ends2, sb.ID(), 30*time.Second)
	if end.Code != sandbox.EndGuestRebooted {
		t.Errorf("end of an adopted VM whose guest rebooted: %+v", end)
	}
	if _, err := os.Stat(got[0].(*Sandbox).RunDir()); !os.IsNotExist(err) {
		t.Errorf("its run directory: %v", err)
	}
}
