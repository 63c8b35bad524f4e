package builtin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/image/layer"
)

// TestDebian12 builds base/debian-12 (once per machine per day: tens of
// seconds the first time) and checks the mounted layer. It fails, rather
// than skips, when the mirror cannot be reached.
func TestDebian12(t *testing.T) {
	needRoot(t)
	art := DebianForTest(t)
	if err := layer.Validate(context.Background(), art); err != nil {
		t.Fatal(err)
	}
	mnt := mount(t, art)
	if b, err := os.ReadFile(filepath.Join(mnt, "etc/debian_version")); err != nil || !strings.HasPrefix(string(b), "12") {
		t.Errorf("etc/debian_version: %q, %v", b, err)
	}
	for _, p := range []string{"usr/bin/apt", "usr/bin/dpkg-query", "var/lib/dpkg/status", "var/lib/dpkg/info/apt.list", "home/user", "workspace", "etc/apt/sources.list"} {
		if _, err := os.Stat(filepath.Join(mnt, p)); err != nil {
			t.Error(err)
		}
	}
	// dpkg's database answers inside the layer.
	out, err := exec.Command("chroot", mnt, "dpkg-query", "-W", "-f", "${Package} ${Status}\n", "apt", "bash").CombinedOutput()
	if err != nil || strings.Count(string(out), "install ok installed") != 2 {
		t.Errorf("dpkg-query in the layer: %q, %v", out, err)
	}
	out, err = exec.Command("chroot", mnt, "id", "user").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "uid=1000(user) gid=1000(user)") {
		t.Errorf("id user: %q, %v", out, err)
	}
	if e := walk(t, filepath.Join(mnt, "home"))["user"]; e.uid != 1000 || e.gid != 1000 || !e.mode.IsDir() {
		t.Errorf("home/user: %+v, want a directory owned by 1000:1000", e)
	}
	for _, dir := range []string{"dev", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial"} {
		ents, err := os.ReadDir(filepath.Join(mnt, dir))
		if err != nil || len(ents) > 0 {
			t.Errorf("%s: %d entries, %v; want it empty", dir, len(ents), err)
		}
	}
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_Packages", "etc/resolv.conf", "var/log/*.log"} {
		if m, _ := filepath.Glob(filepath.Join(mnt, pattern)); len(m) > 0 {
			t.Errorf("left in the layer: %q", m)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/apt/sources.list")); !strings.Contains(string(b), " bookworm main") {
		t.Errorf("etc/apt/sources.list: %q", b)
	}
}
