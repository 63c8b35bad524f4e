package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// staleParent matches the cgroup parents DSec's tests make, named after
// the pid of the test process: dsec-test-<pid>-…, dsec-dtest-<pid>,
// dsec-soak-<pid>-….
var staleParent = regexp.MustCompile(`^dsec-(?:test|dtest|soak)-(\d+)(?:-|$)`)

// SweepDeadTests removes what test processes that were killed (an
// interrupted `go test`, a timeout) left in the cgroup trees: every
// process in a cgroup parent named after a test pid that no longer runs
// a test binary is killed, and the groups are removed. Run from TestMain,
// it keeps a killed run's sandboxes from outliving it on a developer's
// machine; a live run's parents are never touched.
func SweepDeadTests() {
	seen := map[string]bool{}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, root := range roots {
		ents, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, e := range ents {
			m := staleParent.FindStringSubmatch(e.Name())
			if !e.IsDir() || m == nil || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			if pid, _ := strconv.Atoi(m[1]); testAlive(pid) {
				continue
			}
			sweepParent(e.Name(), roots)
		}
	}
}

// testAlive reports whether pid runs a Go test binary (a reused pid runs
// something else).
func testAlive(pid int) bool {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return false
	}
	return strings.HasSuffix(strings.TrimSuffix(exe, " (deleted)"), ".test")
}

// sweepParent kills every process below the parent name in any hierarchy
// and removes its groups, deepest first.
func sweepParent(name string, roots []string) {
	for _, root := range roots {
		dir := filepath.Join(root, name)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		var groups []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				groups = append(groups, p)
			}
			return nil
		})
		for i := len(groups) - 1; i >= 0; i-- {
			g := groups[i]
			// A v1 freezer keeps killed tasks frozen; cgroup2 kills them
			// frozen or not.
			_ = os.WriteFile(filepath.Join(g, "freezer.state"), []byte("THAWED"), 0)
			_ = os.WriteFile(filepath.Join(g, "cgroup.freeze"), []byte("0"), 0)
			if os.WriteFile(filepath.Join(g, "cgroup.kill"), []byte("1"), 0) != nil {
				killMembers(g)
			}
			for try := 0; try < 50; try++ {
				if err := os.Remove(g); err == nil || os.IsNotExist(err) {
					break
				}
				killMembers(g)
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// killMembers SIGKILLs the processes listed in group g's cgroup.procs
// through pidfds opened while they are listed.
func killMembers(g string) {
	b, err := os.ReadFile(filepath.Join(g, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if fd, err := sys.OpenPidfd(pid); err == nil {
			_ = fd.Kill()
			_ = fd.Close()
		}
	}
}
