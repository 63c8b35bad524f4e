package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

// waitFailed polls the sandbox's record until it is failed, and returns
// it and how long that took from since.
func (u *up) waitFailed(ctx context.Context, id string, since time.Time) (*api.Sandbox, time.Duration) {
	u.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := u.c.GetSandbox(ctx, id)
		if err != nil {
			u.t.Fatal(err)
		}
		if sb.State == api.StateFailed {
			return sb, time.Since(since)
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("sandbox %s is %s (%s) 30 s after its end, want failed", id, sb.State, sb.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// endedEvent returns the sandbox's sandbox-ended audit event, waiting
// for it a little (events are published asynchronously).
func (u *up) endedEvent(ctx context.Context, id string) api.AuditEvent {
	u.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := u.c.AuditEvents(ctx, id, 0, 1000)
		if err != nil {
			u.t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Kind == "sandbox-ended" {
				return ev
			}
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("no sandbox-ended audit event of %s among %d events", id, len(evs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notRunning fails the test unless an exec in the sandbox is refused
// with 409 sandbox_not_running.
func (u *up) notRunning(ctx context.Context, id string) {
	u.t.Helper()
	_, err := u.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.StatusCode != 409 || ce.Code != "sandbox_not_running" {
		u.t.Errorf("exec in the failed sandbox: %v, want 409 sandbox_not_running", err)
	}
}

// TestSandboxEndedContainer: a container sandbox whose agent dies (here
// killed from the host: the attacks from inside no longer can,
// internal/container's TestAgentLiveness) is failed within about a
// second, with the reason, an audit event says how, and nothing of it is
// left on the host (the data directory's cleanup checks cgroups,
// networks, mounts and processes).
func TestSandboxEndedContainer(t *testing.T) {
	u := startContainers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(u.dir, "node", "container", "sandboxes", sb.ID, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("the sandbox's state: %s (%v)", b, err)
	}
	// The control: it runs until then.
	if got, err := u.c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("before the kill: %+v, %v", got, err)
	}
	killed := time.Now()
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got, took := u.waitFailed(ctx, sb.ID, killed)
	t.Logf("failed %v after the agent's kill: %s", took, got.Reason)
	if took > 3*time.Second {
		t.Errorf("the record failed %v after the agent's kill", took)
	}
	if got.Reason != "agent_exited: killed by SIGKILL" {
		t.Errorf("reason %q", got.Reason)
	}
	ev := u.endedEvent(ctx, sb.ID)
	if ev.Detail != got.Reason || ev.Rule != "sandbox-ended" || ev.Severity != "high" || ev.Verdict != "failed" || int(ev.Pid) != st.Pid {
		t.Errorf("audit event %+v", ev)
	}
	u.notRunning(ctx, sb.ID)
	if dirs := sandboxCgroups(sb.ID); len(dirs) > 0 {
		t.Errorf("cgroups of the failed sandbox: %v", dirs)
	}
	if _, err := os.Stat(filepath.Join(u.dir, "node", "container", "sandboxes", sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed sandbox's directory: %v", err)
	}
	// Deleting it changes nothing and succeeds.
	if err := u.c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Errorf("deleting the failed sandbox: %v", err)
	}
}

// TestSandboxEndedMicroVM: a VM whose guest panics (sysrq) or powers off
// from inside is failed within about a second of QEMU's end, with the
// reason, an audit event says how, and no QEMU, run directory or cgroup
// of it is left. Two TCG boots.
func TestSandboxEndedMicroVM(t *testing.T) {
	on := withMicroVM(t)
	dir := vmDataDir(t, "TestEnd")
	u := startUp(t, dir, on)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name, cmd, reason string
	}{
		{"panic", "echo c > /proc/sysrq-trigger", "guest_panicked: the guest kernel panicked: Kernel panic - not syncing: sysrq triggered crash"},
		{"poweroff", "poweroff -f", "guest_powered_off: the guest powered off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM})
			if err != nil {
				t.Fatal(err)
			}
			if res, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "up"}}); err != nil || res.Stdout != "up\n" {
				t.Fatalf("the VM before: %+v, %v", res, err)
			}
			ended := time.Now()
			// The command ends with the guest: its call fails.
			_, _ = u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", tc.cmd}})
			got, took := u.waitFailed(ctx, sb.ID, ended)
			t.Logf("failed %v after the command was sent: %s", took, got.Reason)
			if got.Reason != tc.reason {
				t.Errorf("reason %q, want %q", got.Reason, tc.reason)
			}
			ev := u.endedEvent(ctx, sb.ID)
			if ev.Detail != got.Reason || ev.Rule != "sandbox-ended" || !strings.Contains(ev.Path, "qemu") {
				t.Errorf("audit event %+v", ev)
			}
			u.notRunning(ctx, sb.ID)
			if ps := qemuProcsUnder(dir); len(ps) > 0 {
				t.Errorf("QEMU processes left: %v", ps)
			}
			if _, err := os.Stat(filepath.Join(dir, "node", "microvm", sb.ID)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the run directory: %v", err)
			}
			if groups, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", u.cfg.MicroVM.CgroupParent, sb.ID)); len(groups) > 0 {
				t.Errorf("the VM's cgroups: %v", groups)
			}
		})
	}
}
