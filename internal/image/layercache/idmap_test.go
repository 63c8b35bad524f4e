package layercache

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/sys"
)

// TestIDMappedRoots checks that roots show layer files with owners shifted
// into the sandbox's id range, that every root shares one id-mapped clone
// per layer, and that a restarted cache adopts the clones.
func TestIDMappedRoots(t *testing.T) {
	e := newEnv(t)
	const hostUID, hostGID = 1000000, 1000000
	fd, err := sys.NewUserns(hostUID, hostGID, 65536)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.CloseFd(fd)
	base := e.layer(map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/sh\n"})
	ws := e.layer(map[string]string{"workspace/a.txt": "a"})
	idmap := &IDMap{UsernsFd: fd, HostUID: hostUID, HostGID: hostGID}
	c := e.open(Options{IDMap: idmap})
	ctx := context.Background()
	var releases []func()
	for i := 0; i < 10; i++ {
		upper := filepath.Join(e.root, "upper", string(rune('a'+i)))
		if err := os.MkdirAll(upper, 0o755); err != nil {
			t.Fatal(err)
		}
		dir, release, err := c.Root(ctx, "sb-"+string(rune('a'+i)), []Layer{base, ws}, upper)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, "etc/passwd"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != hostUID || st.Gid != hostGID {
			t.Errorf("root-owned image file shows as %d:%d, want %d:%d", st.Uid, st.Gid, hostUID, hostGID)
		}
		if err := syscall.Stat(filepath.Join(upper, "upper"), &st); err != nil || st.Uid != hostUID {
			t.Errorf("upper dir owner %d (%v), want %d", st.Uid, err, hostUID)
		}
	}
	counts := mountsByType(t, e.dir)
	if counts["erofs"] != 4 || counts["overlay"] != 10 {
		t.Errorf("10 id-mapped roots over 2 layers: %v, want 4 erofs (2 layers + 2 clones) and 10 overlays", counts)
	}
	// The views of the function tier are not id-mapped.
	vdir, vrelease, err := c.View(ctx, []Layer{base})
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(vdir, "etc/passwd"), &st); err != nil || st.Uid != 0 {
		t.Errorf("view shows owner %d (%v), want 0", st.Uid, err)
	}
	vrelease()

	// Restart: the clones are adopted, not made again.
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	c = e.open(Options{IDMap: idmap})
	upper := filepath.Join(e.root, "upper", "a")
	if _, release, err := c.Root(ctx, "sb-a", []Layer{base, ws}, upper); err != nil {
		t.Fatalf("re-acquiring an adopted root: %v", err)
	} else {
		releases[0] = release
	}
	if got := mountsByType(t, e.dir); got["erofs"] != 4 {
		t.Errorf("after restart: %v, want the same 4 erofs mounts", got)
	}
	for i, r := range releases {
		if i > 0 {
			// Adopted, not re-acquired: GC removes them.
			continue
		}
		r()
	}
	if err := c.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mountsByType(t, e.dir); len(got) != 0 {
		t.Errorf("after release and GC: %v", got)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
