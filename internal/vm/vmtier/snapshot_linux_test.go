package vmtier

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// snapshotVM captures sb's writable state since idx into a new tree and
// builds its layer, published to the test store, as the node does.
func snapshotVM(t *testing.T, ctx context.Context, sb *Sandbox, since *sandbox.StateIndex) (string, layerspec.Layer, *sandbox.StateIndex, sandbox.CaptureStats, time.Duration) {
	t.Helper()
	work := t.TempDir()
	tree := filepath.Join(work, "tree")
	start := time.Now()
	idx, st, err := sb.CaptureState(ctx, tree, since)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("CaptureState: %v", err)
	}
	a, err := layer.BuildState(ctx, tree, filepath.Join(work, "out"))
	if err != nil {
		t.Fatalf("building the state layer: %v", err)
	}
	if err := publish(ctx, world.store, a); err != nil {
		t.Fatal(err)
	}
	return tree, layerspec.Layer{ID: a.ID(), Manifest: a.Manifest}, idx, st, took
}

// treeFiles lists a captured tree: path, then "d", "f:<content>",
// "l:<target>" or "w" (a whiteout).
func treeFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fi.Sys().(*syscall.Stat_t)
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			out = append(out, rel+" d")
		case syscall.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(b) > 64 {
				b = b[:64]
			}
			out = append(out, rel+" f:"+string(b))
		case syscall.S_IFLNK:
			tgt, _ := os.Readlink(p)
			out = append(out, rel+" l:"+tgt)
		case syscall.S_IFCHR:
			out = append(out, rel+" w")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mustExec runs sh -c script in sb, which must succeed.
func mustExec(t *testing.T, ctx context.Context, sb sandbox.Sandbox, script string) api.ExecResult {
	t.Helper()
	res := guestExec(t, ctx, sb, script)
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d: %s", script, res.ExitCode, res.Stderr)
	}
	return res
}

func hasAll(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s: no %q in %q", what, w, got)
		}
	}
}

func hasNone(t *testing.T, what string, got []string, prefixes ...string) {
	t.Helper()
	for _, g := range got {
		for _, p := range prefixes {
			if strings.HasPrefix(g, p) {
				t.Errorf("%s: %q should not be there", what, g)
			}
		}
	}
}

// TestSnapshot: the guest's agent freezes and streams its upper. A full
// snapshot holds files, directories, a symlink and a whiteout for a
// removed image file; the next holds only what changed and a whiteout
// for what went; a VM booted on [image…, L1, L2] sees the parent's
// tree; the parent runs on after each. Logs the figures docs quote.
func TestSnapshot(t *testing.T) {
	rt, _ := newRuntime(t)
	ctx := ctxT(t, 6*time.Minute)
	sb, err := rt.Create(ctx, busyboxSpec("mvm-snap", Tier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	msb := sb.(*Sandbox)
	mustExec(t, ctx, sb, `mkdir -p /data/sub/deep && echo one > /data/a && echo keep > /data/sub/deep/k &&
		ln -s a /data/link && rm /etc/nsswitch.conf && echo ws > /workspace/w.txt`)

	tree1, l1, idx1, st1, took1 := snapshotVM(t, ctx, msb, nil)
	t.Logf("full snapshot: %v (frozen %v), %d entries, %d copied, %d bytes", took1.Round(time.Millisecond), st1.Frozen.Round(time.Millisecond), st1.Entries, st1.Copied, st1.Bytes)
	got1 := treeFiles(t, tree1)
	hasAll(t, "full snapshot", got1, "data d", "data/a f:one\n", "data/sub/deep/k f:keep\n", "data/link l:a",
		"etc/nsswitch.conf w", "workspace/w.txt f:ws\n")
	if st1.Frozen <= 0 || st1.Frozen > took1 {
		t.Errorf("frozen %v of %v", st1.Frozen, took1)
	}
	// Thawed: the guest writes again.
	mustExec(t, ctx, sb, `echo two >> /data/a && rm /data/link && echo new > /data/new`)

	tree2, l2, idx2, st2, took2 := snapshotVM(t, ctx, msb, idx1)
	t.Logf("incremental snapshot: %v (frozen %v), %d entries, %d copied, %d bytes", took2.Round(time.Millisecond), st2.Frozen.Round(time.Millisecond), st2.Entries, st2.Copied, st2.Bytes)
	got2 := treeFiles(t, tree2)
	hasAll(t, "incremental snapshot", got2, "data/a f:one\ntwo\n", "data/new f:new\n", "data/link w")
	hasNone(t, "incremental snapshot", got2, "data/sub", "workspace/w.txt", "etc/nsswitch.conf")
	if st2.Whiteouts != 1 || st2.Bytes != int64(len("one\ntwo\nnew\n")) {
		t.Errorf("incremental stats %+v: want 1 whiteout and the two changed files' bytes", st2)
	}

	// 16 MiB more.
	mustExec(t, ctx, sb, `dd if=/dev/urandom of=/data/big bs=1M count=16 2>/dev/null`)
	_, _, _, st3, took3 := snapshotVM(t, ctx, msb, idx2)
	t.Logf("snapshot after +16 MiB: %v (frozen %v), %d copied, %d bytes", took3.Round(time.Millisecond), st3.Frozen.Round(time.Millisecond), st3.Copied, st3.Bytes)
	if st3.Bytes != 16<<20 {
		t.Errorf("after +16 MiB: %d bytes copied", st3.Bytes)
	}
	// The parent runs on, writable.
	if res := guestExec(t, ctx, sb, `echo after > /data/after && cat /data/after`); res.Stdout != "after\n" {
		t.Errorf("the parent after its snapshots: %+v", res)
	}

	// A VM on [image…, L1, L2] is the parent's tree at the second snapshot.
	spec := busyboxSpec("mvm-snap-child", Tier)
	spec.Image.Layers = append(slices.Clone(world.layers), l1, l2)
	child, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create from the state layers: %v", err)
	}
	t.Cleanup(func() { child.Destroy(context.Background()) })
	res := guestExec(t, ctx, child, `cat /data/a /data/new /data/sub/deep/k /workspace/w.txt; for p in /data/link /etc/nsswitch.conf /data/big /data/after; do [ -e $p ] && echo "$p is there"; done; true`)
	if want := "one\ntwo\nnew\nkeep\nws\n"; res.Stdout != want {
		t.Errorf("the child sees %q, want %q", res.Stdout, want)
	}
	// The child is its own: its writes do not reach the parent.
	mustExec(t, ctx, child, `echo child > /data/a`)
	if res := guestExec(t, ctx, sb, `cat /data/a`); res.Stdout != "one\ntwo\n" {
		t.Errorf("the parent sees %q after the child's write", res.Stdout)
	}
}
