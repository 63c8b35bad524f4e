package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
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
	dir, err := os.MkdirTemp("", "TestVmr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ps := qemuProcsUnder(dir); len(ps) > 0 {
			t.Errorf("QEMU processes left: %v", ps)
			for _, p := range ps {
				if pr, err := os.FindProcess(p.Pid); err == nil {
					_ = pr.Kill()
				}
			}
		}
		os.RemoveAll(dir)
	})
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
