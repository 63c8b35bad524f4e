package container

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layer"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// snapshotOf captures sb's state (since an earlier index, or whole),
// builds its layer and publishes it to the test blob store, as the node
// does. It returns the layer, the index and the layer's size in bytes.
func snapshotOf(t testing.TB, sb *Sandbox, since *sandbox.StateIndex) (layerspec.Layer, *sandbox.StateIndex, int64, sandbox.CaptureStats) {
	t.Helper()
	ctx := context.Background()
	work := t.TempDir()
	idx, st, err := sb.CaptureState(ctx, filepath.Join(work, "tree"), since)
	if err != nil {
		t.Fatalf("capturing %s: %v", sb.id, err)
	}
	a, err := layer.BuildState(ctx, filepath.Join(work, "tree"), filepath.Join(work, "out"))
	if err != nil {
		t.Fatalf("building the state layer of %s: %v", sb.id, err)
	}
	l, err := world.publish(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return l, idx, a.Manifest.Meta.Size + a.Manifest.Blob.Size, st
}

// treeListing lists what a snapshot must carry over, the same way in
// any sandbox: types, modes, owners, times, link targets, contents; not
// the files each sandbox gets its own of (bind mounts of the node's).
const treeListing = `cd / && P="data usr etc bin home big" && (
find $P ! -type l | sort | xargs stat -c '%n %f %u %g %Y'
find $P -type l | sort | while read l; do echo "$l -> $(readlink $l)"; done
find $P -type f | sort | xargs md5sum) | grep -v -e etc/hostname -e etc/hosts -e etc/resolv.conf`

func listing(t testing.TB, sb *Sandbox) string {
	t.Helper()
	res := run(t, sb, "/bin/sh", "-c", treeListing)
	if res.ExitCode != 0 || res.Stdout == "" {
		t.Fatalf("listing %s: %+v", sb.id, res)
	}
	return res.Stdout
}

// TestSnapshotRoundTrip: a sandbox created from [image…, state layer]
// sees exactly the snapshotted tree (files, dirs, symlinks, modes,
// owners, a deleted image file, an opaque directory, a file in a new
// directory); its writes do not reach the parent; the second snapshot
// after a 1 MiB change holds about that much, and [image…, L1, L2] is
// the parent's tree again, a file removed between the two included.
func TestSnapshotRoundTrip(t *testing.T) {
	w := world.get(t)
	dir := t.TempDir()
	t.Cleanup(func() { checkHost(t, dir) })
	rt := newRuntime(t, dir, runtimeOptions{})
	spec := func(id string, extra ...layerspec.Layer) sandbox.Spec {
		return sandbox.Spec{ID: id, Image: sandbox.Image{ID: "busybox", Name: "busybox", Layers: append(append([]layerspec.Layer{}, w.busybox...), extra...)}, DiskMB: 256, MemoryMB: 512}
	}
	parent := createIn(t, rt, spec("snap-parent"), nil)
	setup := `set -e
mkdir -p /data/sub /data/empty && echo hello > /data/sub/f && chmod 640 /data/sub/f && ln -s sub/f /data/link && chmod 750 /data
echo gone-later > /data/sub/g
rm /bin/true
rm -rf /usr/sbin && mkdir /usr/sbin && echo only > /usr/sbin/only
echo u > /home/user/u && chown 1000:1000 /home/user/u
echo secret > /etc/mine && chmod 4755 /etc/mine
ln /data/sub/f /data/hard
dd if=/dev/urandom of=/big bs=1M count=60 2>/dev/null`
	if res := run(t, parent, "/bin/sh", "-c", setup); res.ExitCode != 0 {
		t.Fatalf("setup: %+v", res)
	}
	want := listing(t, parent)
	l1, idx, size1, st1 := snapshotOf(t, parent, nil)
	if size1 < 50<<20 {
		t.Errorf("the first snapshot is %d bytes, want more than 50 MiB (it holds a 60 MiB file)", size1)
	}
	t.Logf("first snapshot: %d bytes, %+v", size1, st1)

	child := createIn(t, rt, spec("snap-child", l1), nil)
	if got := listing(t, child); got != want {
		t.Errorf("the child's tree differs from its parent's:\n%s", diffLines(want, got))
	}
	if res := run(t, child, "/bin/sh", "-c", "test ! -e /bin/true && test ! -e /usr/sbin/reboot && test -e /usr/bin/awk"); res.ExitCode != 0 {
		t.Errorf("the child sees a deleted image file, or the opaque dir's old entries, or lost an untouched one: %+v", res)
	}
	// Negative control: a tree that differs is seen to differ.
	if res := run(t, child, "/bin/sh", "-c", "echo child > /data/sub/f2 && echo changed > /data/sub/f"); res.ExitCode != 0 {
		t.Fatal(res)
	}
	if listing(t, child) == want {
		t.Error("the listing does not see a change")
	}
	if res := run(t, parent, "/bin/sh", "-c", "test ! -e /data/sub/f2 && grep -qx hello /data/sub/f"); res.ExitCode != 0 {
		t.Errorf("the child's writes reached the parent: %+v", res)
	}

	// Incremental: 1 MiB more, a file of L1 removed.
	if res := run(t, parent, "/bin/sh", "-c", "dd if=/dev/urandom of=/data/mib bs=1M count=1 2>/dev/null && rm /data/sub/g"); res.ExitCode != 0 {
		t.Fatal(res)
	}
	want2 := listing(t, parent)
	l2, _, size2, st2 := snapshotOf(t, parent, idx)
	t.Logf("second snapshot: %d bytes, %+v", size2, st2)
	if size2 >= 2<<20 {
		t.Errorf("the second snapshot after a 1 MiB change is %d bytes, want less than 2 MiB", size2)
	}
	if st2.Whiteouts == 0 {
		t.Error("the second snapshot has no whiteout for the removed file")
	}
	grand := createIn(t, rt, spec("snap-grand", l1, l2), nil)
	if got := listing(t, grand); got != want2 {
		t.Errorf("[image, L1, L2] differs from the parent's tree:\n%s", diffLines(want2, got))
	}

	// A node that restarted has no index: its next snapshot is a full
	// one, which alone on the image is the parent's tree too.
	l3, _, size3, _ := snapshotOf(t, parent, nil)
	if size3 < 50<<20 {
		t.Errorf("a full snapshot is %d bytes, want more than 50 MiB", size3)
	}
	full := createIn(t, rt, spec("snap-full", l3), nil)
	if got := listing(t, full); got != want2 {
		t.Errorf("[image, full snapshot] differs from the parent's tree:\n%s", diffLines(want2, got))
	}

	// Not running: a destroyed sandbox, and one whose upper is out of reach.
	if err := child.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := child.CaptureState(context.Background(), t.TempDir(), nil); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("snapshot of a destroyed sandbox: %v, want NotFound", err)
	}
	grand.closeUpper()
	if _, _, err := grand.CaptureState(context.Background(), t.TempDir(), nil); errdefs.CodeOf(err) != api.CodeUnsupportedOnTier {
		t.Errorf("snapshot of a sandbox without its upper: %v, want unsupported_on_tier", err)
	}
}

// diffLines shows the lines only one of a and b has.
func diffLines(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// BenchmarkSnapshot measures a snapshot (capture while frozen, layer
// build) of a 10 MB and a 100 MB upper, and the second snapshot after a
// 1 MB change: time, time frozen, bytes stored.
func BenchmarkSnapshot(b *testing.B) {
	world.get(b)
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	rt := newRuntime(b, dir, runtimeOptions{})
	for _, mb := range []int{10, 100} {
		sb := createIn(b, rt, sandbox.Spec{ID: fmt.Sprintf("bsnap%d", mb), Image: world.image(), DiskMB: 512, MemoryMB: 1024}, nil)
		fill := fmt.Sprintf("mkdir -p /data && cd /data && for i in $(seq %d); do dd if=/dev/urandom of=f$i bs=1M count=1 2>/dev/null; done", mb)
		if res := run(b, sb, "/bin/sh", "-c", fill); res.ExitCode != 0 {
			b.Fatal(res)
		}
		var idx *sandbox.StateIndex
		b.Run(fmt.Sprintf("full/%dMB", mb), func(b *testing.B) {
			var frozen time.Duration
			var size int64
			for b.Loop() {
				var st sandbox.CaptureStats
				_, idx, size, st = snapshotOf(b, sb, nil)
				frozen += st.Frozen
			}
			b.ReportMetric(float64(frozen.Microseconds())/1000/float64(b.N), "frozen-ms/op")
			b.ReportMetric(float64(size), "bytes")
		})
		b.Run(fmt.Sprintf("after1MB/%dMB", mb), func(b *testing.B) {
			var frozen time.Duration
			var size int64
			for b.Loop() {
				b.StopTimer()
				if res := run(b, sb, "/bin/sh", "-c", "dd if=/dev/urandom of=/data/change bs=1M count=1 2>/dev/null"); res.ExitCode != 0 {
					b.Fatal(res)
				}
				b.StartTimer()
				var st sandbox.CaptureStats
				_, idx, size, st = snapshotOf(b, sb, idx)
				frozen += st.Frozen
			}
			b.ReportMetric(float64(frozen.Microseconds())/1000/float64(b.N), "frozen-ms/op")
			b.ReportMetric(float64(size), "bytes")
		})
	}
}
