package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/guard"
)

// cgroupParentDirs lists the directories of the cgroup parents named in
// any hierarchy under /sys/fs/cgroup.
func cgroupParentDirs(parents ...string) []string {
	var out []string
	for _, p := range parents {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", p))
		if d := filepath.Join("/sys/fs/cgroup", p); isDirectory(d) {
			dirs = append(dirs, d)
		}
		out = append(out, dirs...)
	}
	return out
}

// TestStopAndRestartLeaveNoNoise: a node with the container and VM tiers
// that stops with no sandbox left leaves none of its cgroup parents (the
// container tier's and each VM tier's, in every hierarchy); one that
// keeps sandboxes keeps them, and its restart re-adopts sandboxes with
// and without network access without logging an error.
func TestStopAndRestartLeaveNoNoise(t *testing.T) {
	ct, mv := withContainers(t), withMicroVM(t)
	dir := containerDataDir(t)
	var parents []string
	adjust := func(keep bool) func(*config.Config) {
		return func(c *config.Config) {
			ct(c)
			mv(c)
			c.KeepSandboxes = keep
			parents = []string{c.Container.CgroupParent, c.MicroVM.CgroupParent, c.VM.CgroupParent}
		}
	}
	noErrors := func(u *up, when string) {
		t.Helper()
		if lines := u.log.matching("level=ERROR"); len(lines) > 0 {
			t.Errorf("%s, the daemon logged errors:\n%s", when, strings.Join(lines, "\n"))
		}
	}

	names, _ := containerNames()
	pins := guard.PinDir(names.Net)
	u := startUp(t, dir, adjust(false))
	if got := cgroupParentDirs(parents...); len(got) < 3 {
		t.Fatalf("a running node has cgroup parents %v; want the three tiers' (else this test checks nothing)", got)
	}
	guarded := u.info.Guard == "on"
	t.Logf("cgroup-bpf guard: %s", u.info.Guard)
	noErrors(u, "at the first start")
	u.stop()
	if left := cgroupParentDirs(parents...); len(left) > 0 {
		t.Errorf("a stop with no sandbox left cgroup parents: %v", left)
	}
	// The cgroup-bpf guard, attached to the parent that went, is gone too.
	if _, err := os.Stat(pins); guarded && !os.IsNotExist(err) {
		t.Errorf("the guard's pins after a stop with no sandbox: %v, want none", err)
	}

	u = startUp(t, dir, adjust(true))
	ctx := context.Background()
	var ids []string
	for _, net := range []*api.NetworkPolicy{nil, nil, {Egress: api.EgressOpen}} {
		sb, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox", Network: net})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	u.stop()
	if got := cgroupParentDirs(parents[0]); len(got) == 0 {
		t.Error("a stop that keeps sandboxes removed their cgroup parent")
	}

	u = startUp(t, dir, adjust(true))
	for _, id := range ids {
		if res, err := u.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"echo", "alive"}}); err != nil || res.Stdout != "alive\n" {
			t.Errorf("exec in %s after the restart: %+v, %v", id, res, err)
		}
	}
	noErrors(u, "restarting with kept sandboxes")
	u.stop()

	// A start that does not keep them destroys them at its stop.
	u = startUp(t, dir, adjust(false))
	noErrors(u, "starting over kept sandboxes")
	u.stop()
	if left := cgroupParentDirs(parents...); len(left) > 0 {
		t.Errorf("a stop that destroyed every sandbox left cgroup parents: %v", left)
	}
}
