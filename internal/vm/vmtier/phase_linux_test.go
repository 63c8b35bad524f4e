package vmtier

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// TestPhases boots one microVM with phases and checks what the guest's
// agent enforces at a phase change, each with a control that shows the
// check could fail: a background process of the earlier phase is gone
// (it ran before), a path outside Writable cannot be written (it could
// before), commands run as the phase's user with its capabilities (root
// with CAP_CHOWN before), and a writable path that is a symlink is
// refused (the symlink leads out of the writable tree in the guest). It
// also measures phase changes and exec latency in a phase.
func TestPhases(t *testing.T) {
	rt, _ := newRuntime(t)
	ctx := ctxT(t, 5*time.Minute)
	setup := api.Phase{Name: "setup", Capabilities: []string{"CAP_CHOWN"}}
	work := api.Phase{Name: "work", Writable: []string{"/workspace"}, User: "1000:1000"}
	work2 := api.Phase{Name: "work2", Writable: []string{"/workspace", "/tmp"}, User: "1000:1000"}
	escape := api.Phase{Name: "escape", Writable: []string{"/escape"}, User: "1000:1000"}
	spec := busyboxSpec("mvm-phases", Tier)
	spec.Phases = []api.Phase{setup, work, work2, escape}
	sb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	ph := sb.(sandbox.Phaser)
	pr := sb.(sandbox.ProcessRunner)
	exec := func(script string) api.ExecResult {
		t.Helper()
		res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(script), TimeoutS: 30}})
		if err != nil {
			t.Fatalf("Exec %q: %v", script, err)
		}
		return res
	}
	if ph.Phase() != "setup" {
		t.Fatalf("Phase() = %q, want setup", ph.Phase())
	}

	// Controls, in the first phase: root with CAP_CHOWN only, the whole
	// root writable, a background process running.
	if res := exec(`id -u; grep CapEff /proc/self/status; chown 1000:1000 /workspace && echo chowned`); res.Stdout != "0\nCapEff:\t0000000000000001\nchowned\n" || res.Phase != "setup" {
		t.Errorf("setup phase: user, capabilities, chown: %+v", res)
	}
	if _, err := sb.Files().Write(ctx, "/etc/setup-file", strings.NewReader("x"), sandbox.WriteOptions{}); err != nil {
		t.Errorf("control: writing /etc in the setup phase: %v", err)
	}
	if res := exec(`ln -s /etc /escape && readlink /escape`); res.Stdout != "/etc\n" {
		t.Errorf("control: /escape -> /etc: %+v", res)
	}
	bg, err := pr.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sleep", "600"}}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	// A daemon the agent does not track: killed all the same.
	exec(`setsid sleep 601 </dev/null >/dev/null 2>&1 &`)
	if info := bg.Info(); info.State != api.ProcessRunning {
		t.Fatalf("control: background process before the change: %+v", info)
	}
	if res := exec(`for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -xc sleep`); strings.TrimSpace(res.Stdout) != "2" {
		t.Errorf("control: sleeps before the change: %+v", res)
	}

	start := time.Now()
	if err := ph.SetPhase(ctx, work); err != nil {
		t.Fatalf("SetPhase(work): %v", err)
	}
	t.Logf("first phase change: %v", time.Since(start).Round(time.Millisecond))
	if ph.Phase() != "work" {
		t.Errorf("Phase() = %q, want work", ph.Phase())
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	res, err := bg.Wait(wctx)
	cancel()
	if err != nil || res.ExitCode == 0 {
		t.Errorf("the earlier phase's background process: %+v, %v; want killed", res, err)
	}
	if res := exec(`for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -xc sleep`); strings.TrimSpace(res.Stdout) != "0" {
		t.Errorf("sleeps after the change: %+v", res)
	}
	if res := exec(`id -u; id -g; grep CapEff /proc/self/status`); res.Stdout != "1000\n1000\nCapEff:\t0000000000000000\n" || res.Phase != "work" {
		t.Errorf("work phase: user and capabilities: %+v", res)
	}
	// Outside Writable: read-only for every writer, the agent (files
	// API, root) included.
	if _, err := sb.Files().Write(ctx, "/etc/work-file", strings.NewReader("x"), sandbox.WriteOptions{}); err == nil {
		t.Error("writing /etc through the files API in the work phase succeeded")
	}
	if res := exec(`touch /etc/x 2>&1; echo rc=$?; grep ' / ' /proc/mounts`); !strings.Contains(res.Stdout, "rc=1") || !strings.Contains(res.Stdout, " ro,") && !strings.Contains(res.Stdout, " ro ") {
		t.Errorf("writing /etc in the work phase: %+v", res)
	}
	// Inside Writable: writable (and owned by the phase's user, chowned
	// in setup).
	if res := exec(`echo hi > /workspace/ok && cat /workspace/ok`); res.Stdout != "hi\n" {
		t.Errorf("writing /workspace in the work phase: %+v", res)
	}
	if _, err := sb.Files().Write(ctx, "/workspace/api", strings.NewReader("x"), sandbox.WriteOptions{}); err != nil {
		t.Errorf("writing /workspace through the files API: %v", err)
	}

	// A writable path that is a symlink is refused, whatever it leads
	// to; the phase stays, /etc stays read-only.
	err = ph.SetPhase(ctx, escape)
	if err == nil {
		t.Error("SetPhase with a symlinked writable path succeeded")
	}
	if res := exec(`touch /etc/y 2>&1; echo rc=$?`); !strings.Contains(res.Stdout, "rc=1") {
		t.Errorf("/etc after the refused phase: %+v", res)
	}

	// Executables and limits cannot be enforced in a guest: refused.
	if err := ph.SetPhase(ctx, api.Phase{Name: "x", Writable: []string{}, Executables: []string{"/bin/sh"}}); !errors.Is(err, errdefs.Unsupported) || errdefs.CodeOf(err) != "executables_unenforced" {
		t.Errorf("SetPhase with executables: %v, want Unsupported executables_unenforced", err)
	}

	// Latency: phase changes back and forth, and exec in a phase.
	var lat []time.Duration
	for i := range 10 {
		p := work2 // the last one
		if i%2 == 0 {
			p = work
		}
		s := time.Now()
		if err := ph.SetPhase(ctx, p); err != nil {
			t.Fatalf("SetPhase(%s): %v", p.Name, err)
		}
		lat = append(lat, time.Since(s))
	}
	slices.Sort(lat)
	t.Logf("phase change latency (10 changes): p50 %v, max %v", lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
	if res := exec(`touch /tmp/w2 /workspace/w2 && echo ok`); res.Stdout != "ok\n" || res.Phase != "work2" {
		t.Errorf("work2 phase: %+v", res)
	}
	var elat []time.Duration
	for range 10 {
		s := time.Now()
		exec("true")
		elat = append(elat, time.Since(s))
	}
	slices.Sort(elat)
	t.Logf("exec latency in a phase (true, 10 runs): p50 %v, max %v", elat[len(elat)/2].Round(time.Microsecond), elat[len(elat)-1].Round(time.Microsecond))

	// A restarted node adopts the VM in its phase: same user, same
	// read-only root, host-side stats from the adopted QEMU.
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rt2, err := New(ctx, rt.opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt2.Close(context.Background()) })
	got, err := rt2.Recover(ctx)
	if err != nil || len(got) != 1 {
		t.Fatalf("Recover = %d sandboxes, %v", len(got), err)
	}
	sb2 := got[0]
	defer sb2.Destroy(ctx)
	if p := sb2.(sandbox.Phaser).Phase(); p != "work2" {
		t.Errorf("recovered phase = %q, want work2", p)
	}
	res2, err := sb2.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: sh(`id -u; touch /etc/z 2>/dev/null || echo ro`)}})
	if err != nil || res2.Stdout != "1000\nro\n" || res2.Phase != "work2" {
		t.Errorf("recovered sandbox: %+v, %v", res2, err)
	}
	if st, err := sb2.Stats(ctx); err != nil || st.HostMemoryBytes == 0 || st.CPUSeconds == 0 {
		t.Errorf("recovered Stats = %+v, %v", st, err)
	}
}

// TestPhaseSpecRefused checks the specs the microvm tier refuses before
// booting: allowed executables and phase limits it cannot enforce.
func TestPhaseSpecRefused(t *testing.T) {
	r := &Runtime{sandboxes: map[string]*Sandbox{}}
	for _, tc := range []struct {
		name  string
		phase api.Phase
		code  string
	}{
		{"executables", api.Phase{Name: "a", Executables: []string{"/bin/sh"}}, "executables_unenforced"},
		{"memory", api.Phase{Name: "a", MemoryMB: 512}, "phase_limits_unsupported"},
		{"cpu", api.Phase{Name: "a", CPU: 64}, "phase_limits_unsupported"},
		{"same limits", api.Phase{Name: "a", MemoryMB: 256, CPU: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := sandbox.Spec{ID: "x", CPU: 1, MemoryMB: 256, Image: sandbox.Image{Name: "i", Layers: []layerspec.Layer{{ID: "sha256:0"}}}, Phases: []api.Phase{tc.phase}}
			_, _, err := r.check(spec)
			if tc.code == "" && err != nil || tc.code != "" && errdefs.CodeOf(err) != tc.code {
				t.Errorf("check = %v, want code %q", err, tc.code)
			}
		})
	}
}

// TestFingerprintOversight checks what the tier tells the control plane
// for integrity reports: its commands run on a guest kernel (so the
// node's monitor never counts as watching them), and which parts of a
// phase the guest applies.
func TestFingerprintOversight(t *testing.T) {
	r := &Runtime{sandboxes: map[string]*Sandbox{}}
	info := r.Fingerprint(context.Background())
	if !info.GuestKernel || !slices.Equal(info.GuestEnforced, []string{"writable", "user", "capabilities", "processes"}) {
		t.Errorf("Fingerprint = %+v", info)
	}
	if c := r.Capabilities(); !c.Processes || !c.PTY {
		t.Errorf("Capabilities = %+v: want processes and PTY", c)
	}
}
