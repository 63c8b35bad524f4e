package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// SweepStale unmounts what an earlier, killed test run left mounted in
// the temporary directory: mounts below a /tmp/Test…/ or /tmp/Benchmark…/
// directory (t.TempDir's and b.TempDir's) older than maxAge (no live test
// runs that long, so no running test loses a mount). Tests and
// benchmarks that crash, time out or are interrupted never run their
// cleanups; without this, a developer's machine would keep their tmpfs
// and namespace mounts until reboot.
func SweepStale(maxAge time.Duration) {
	tmp := filepath.Clean(os.TempDir())
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return
	}
	var stale []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !(strings.HasPrefix(fields[1], tmp+"/Test") || strings.HasPrefix(fields[1], tmp+"/Benchmark")) {
			continue
		}
		top := filepath.Join(tmp, strings.SplitN(strings.TrimPrefix(fields[1], tmp+"/"), "/", 2)[0])
		if fi, err := os.Stat(top); err == nil && time.Since(fi.ModTime()) > maxAge {
			stale = append(stale, fields[1])
		}
	}
	f.Close()
	// Deepest first, so nested mounts come off before their parents.
	sort.Slice(stale, func(i, j int) bool { return len(stale[i]) > len(stale[j]) })
	for _, m := range stale {
		_ = sys.DetachMount(m)
	}
}

// UnmountAll detaches every mount at or below dir, deepest first.
func UnmountAll(dir string) {
	ms, _ := sys.MountsUnder(dir)
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	for _, m := range ms {
		_ = sys.DetachMount(m)
	}
}
