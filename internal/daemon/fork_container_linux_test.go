package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

// TestForkContainer forks a container sandbox eight ways: every child
// sees the parent's files, a child's write is its own, and snapshots
// taken with nothing changed since the last (whose deltas are equal,
// and a stack may not name a layer twice) still fork.
func TestForkContainer(t *testing.T) {
	u := startContainers(t)
	ctx := context.Background()
	c := u.c
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Trajectory: "fork-ct"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Command: "mkdir -p /workspace/d && echo parent > /workspace/d/f && rm -f /etc/motd"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing in the parent: %+v, %v", res, err)
	}
	fr, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Sandboxes) != 8 {
		t.Fatalf("fork(8) made %d", len(fr.Sandboxes))
	}
	// The snapshot's layer uploads while the children start; the fork's
	// answer and the snapshot's record say what the upload stored.
	if got, err := c.GetSnapshot(ctx, fr.Snapshot.ID); err != nil || fr.Snapshot.Bytes == 0 || got.Bytes != fr.Snapshot.Bytes {
		t.Errorf("the fork's snapshot stored %d bytes; its record: %+v, %v", fr.Snapshot.Bytes, got, err)
	}
	kids := make([]string, 0, 8)
	for _, ch := range fr.Sandboxes {
		kids = append(kids, ch.ID)
	}
	defer func() {
		for _, id := range append(kids, sb.ID) {
			_ = c.DeleteSandbox(context.Background(), id)
		}
	}()
	for i, id := range kids {
		if got := readString(t, c, id, "d/f"); got != "parent\n" {
			t.Errorf("child %d sees %q", i, got)
		}
		if _, err := c.StatFile(ctx, id, "/etc/motd"); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("child %d: the parent's removal of /etc/motd: %v", i, err)
		}
	}
	if res, err := c.Exec(ctx, kids[0], api.ExecRequest{Command: "echo mine > /workspace/only0"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing in child 0: %+v, %v", res, err)
	}
	for _, id := range append(slices.Clone(kids[1:]), sb.ID) {
		if _, err := c.StatFile(ctx, id, "only0"); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("child 0's write seen in %s: %v", id, err)
		}
	}

	// Nothing changed since the fork's snapshot: the next two are the
	// same (empty) delta.
	var last api.Snapshot
	for i := range 2 {
		if last, err = c.Snapshot(ctx, sb.ID); err != nil {
			t.Fatalf("snapshot %d without a change: %v", i+1, err)
		}
	}
	if n := len(last.Layers); n < 2 || last.Layers[n-1] == last.Layers[n-2] {
		t.Errorf("the unchanged sandbox's snapshot stacks %q", last.Layers)
	}
	again, err := c.Fork(ctx, sb.ID, api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatalf("fork after unchanged snapshots: %v", err)
	}
	kids = append(kids, again.Sandboxes[0].ID)
	if got := readString(t, c, again.Sandboxes[0].ID, "d/f"); !strings.HasPrefix(got, "parent") {
		t.Errorf("child of the later fork sees %q", got)
	}
}
