package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/config"
)

// TestForkMicroVM forks a microvm sandbox through `dsec up`'s API: the
// guest's agent freezes and streams its upper into a state layer, and
// each child boots with that layer over the image, sees the parent's
// files and writes only its own. Three TCG boots; the start queue's wait
// is raised for them (one VM boots per CPU at a time).
func TestForkMicroVM(t *testing.T) {
	on := withMicroVM(t)
	dir := vmDataDir(t, "TestMvf")
	u := startUp(t, dir, func(c *config.Config) {
		on(c)
		c.Node.StartWaitS = 600
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := u.c
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256, DiskMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/data/shared.txt", strings.NewReader("from the parent"), client.WriteOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	if err := execOK(ctx, c, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "mkdir -p /data/d && ln -s ../shared.txt /data/d/link && rm -f /etc/motd"}}); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	fr, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 2})
	if err != nil {
		t.Fatalf("fork(2) of a microvm sandbox: %v", err)
	}
	t.Logf("fork(2): %v; snapshot %s, %d bytes stored", time.Since(start).Round(time.Millisecond), fr.Snapshot.ID, fr.Snapshot.Bytes)
	if len(fr.Sandboxes) != 2 || fr.Snapshot.Tier != api.TierMicroVM || fr.Snapshot.Bytes <= 0 {
		t.Fatalf("fork: %+v", fr)
	}
	for i, ch := range fr.Sandboxes {
		if ch.Tier != api.TierMicroVM {
			t.Errorf("child %d is a %s sandbox", i, ch.Tier)
		}
		if got := readString(t, c, ch.ID, "/data/shared.txt"); got != "from the parent" {
			t.Errorf("child %d sees %q", i, got)
		}
		res, err := c.Exec(ctx, ch.ID, api.ExecRequest{Cmd: []string{"cat", "/data/d/link"}})
		if err != nil || res.Stdout != "from the parent" {
			t.Errorf("child %d through the symlink: %+v, %v", i, res, err)
		}
	}
	if _, err := c.WriteFile(ctx, fr.Sandboxes[0].ID, "/data/mine.txt", strings.NewReader("child 0"), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, fr.Sandboxes[1].ID} {
		if _, err := c.StatFile(ctx, id, "/data/mine.txt"); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("child 0's write seen in %s: %v", id, err)
		}
	}
	// The parent runs on and snapshots again (incremental: the file it
	// wrote since, nothing of its children's).
	if _, err := c.WriteFile(ctx, sb.ID, "/data/later.txt", strings.NewReader("later"), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	snap, err := c.Snapshot(ctx, sb.ID)
	if err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
	if len(snap.Layers) != 2 {
		t.Errorf("second snapshot's state layers: %v, want the fork's and its own", snap.Layers)
	}
	for _, ch := range append(fr.Sandboxes, *sb) {
		if err := c.DeleteSandbox(ctx, ch.ID); err != nil {
			t.Error(err)
		}
	}
	if ps := qemuProcsUnder(dir); len(ps) > 0 {
		t.Errorf("QEMU processes after the deletes: %v", ps)
	}
	u.stop()
	if ents, _ := os.ReadDir(filepath.Join(dir, "node", "microvm")); len(ents) > 0 {
		t.Errorf("run directories left: %v", ents)
	}
}
