package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
)

// TestVMTiersSurviveRestart creates a microvm and a vm sandbox through
// the API, stops the daemon keeping its sandboxes (their QEMUs run on,
// jailed), starts it again, and checks both still run commands and hold
// their files; then deletes them and checks nothing of QEMU is left: no
// process, run directory or cgroup (withMicroVM's cleanup). Two TCG
// boots.
func TestVMTiersSurviveRestart(t *testing.T) {
	on := withMicroVM(t)
	dir := vmDataDir(t, "TestVmr")
	keep := func(c *config.Config) { on(c); c.KeepSandboxes = true }
	u := startUp(t, dir, keep)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var ids []string
	for _, tier := range []string{api.TierMicroVM, api.TierVM} {
		start := time.Now()
		sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: tier, MemoryMB: 256})
		if err != nil {
			t.Fatalf("create on %s: %v", tier, err)
		}
		t.Logf("created %s on %s in %v", sb.ID, tier, time.Since(start).Round(time.Millisecond))
		if _, err := u.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /tmp/note"}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	u.stop()
	if ps := qemuProcsUnder(dir); len(ps) != 2 {
		t.Errorf("QEMU processes while the daemon is down: %v, want 2", ps)
	}

	u = startUp(t, dir, keep)
	for _, id := range ids {
		res, err := u.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"cat", "/tmp/note"}})
		if err != nil || res.Stdout != "kept\n" {
			t.Errorf("exec in %s after the restart: %+v, %v", id, res, err)
		}
	}
	for _, id := range ids {
		if err := u.c.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	u.stop()
	if ps := qemuProcsUnder(dir); len(ps) > 0 {
		t.Errorf("QEMU processes after the deletes: %v", ps)
	}
	for _, tier := range []string{api.TierMicroVM, api.TierVM} {
		if ents, _ := os.ReadDir(filepath.Join(dir, "node", tier)); len(ents) > 0 {
			t.Errorf("%s run directories left: %v", tier, ents)
		}
	}
}

// TestMicroVMNodeKilledMidCreate kills -9 a `dsec up` process while a
// microvm create is booting (its QEMU running, its state file maybe not
// yet written), with another microvm sandbox ready. The restarted node
// must re-adopt the ready one (it still runs commands), fail or clean up
// the interrupted one, and after the delete and shutdown leave no QEMU,
// run directory or cgroup (withMicroVM's cleanup checks the cgroups).
func TestMicroVMNodeKilledMidCreate(t *testing.T) {
	on := withMicroVM(t)
	onlyMicroVM := func(c *config.Config) { on(c); c.VM.Disabled = true }
	dir := vmDataDir(t, "TestVmk")
	cfg := config.Defaults()
	cfg.DataDir, cfg.API.Listen, cfg.NATS.Listen, cfg.Node.ID = dir, "127.0.0.1:0", "none", "test-node"
	cfg.LogLevel = "warn"
	cfg.Images.BuiltinCache, cfg.Images.SkipSlow = builtinCache, true
	cfg.Container.Disabled = true
	onlyMicroVM(&cfg)
	d := startProcDaemon(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	kept, err := d.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	go func() { // fails when the node dies
		_, _ = d.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	}()
	deadline := time.Now().Add(time.Minute)
	for len(qemuProcsUnder(dir)) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the second VM's QEMU did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.kill()
	if n := len(qemuProcsUnder(dir)); n != 2 {
		t.Errorf("%d QEMU processes after the kill, want 2 (VMs outlive the node)", n)
	}

	u := startUp(t, dir, onlyMicroVM)
	if res, err := u.c.Exec(ctx, kept.ID, api.ExecRequest{Cmd: []string{"echo", "alive"}}); err != nil || res.Stdout != "alive\n" {
		t.Errorf("exec in the ready sandbox after the crash: %+v, %v", res, err)
	}
	// The interrupted create's VM goes: swept (no state file) or, if it
	// was recorded and adopted, destroyed with its failed record.
	all, err := u.c.ListAllSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if sb.ID != kept.ID && sb.State == api.StatePending {
			waitState(t, u.c, sb.ID, api.StateFailed, 30*time.Second)
		}
	}
	deadline = time.Now().Add(30 * time.Second)
	for len(qemuProcsUnder(dir)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU processes after the restart: %v, want only the ready sandbox's", qemuProcsUnder(dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := u.c.DeleteSandbox(ctx, kept.ID); err != nil {
		t.Fatal(err)
	}
	u.stop()
	if ps := qemuProcsUnder(dir); len(ps) > 0 {
		t.Errorf("QEMU processes after the delete: %v", ps)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "node", api.TierMicroVM)); len(ents) > 0 {
		t.Errorf("run directories left: %v", ents)
	}
}
