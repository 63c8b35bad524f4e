package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestSweepDeadTests: a killed test run's cgroup parent (named after a
// pid no test runs under) loses its processes and groups; a live run's
// parent (this test's own pid) is left alone.
func TestSweepDeadTests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("dsec-test-%d-9-stale", gone.Process.Pid)
	live := fmt.Sprintf("dsec-test-%d-9-live", os.Getpid())
	hier := []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory"}
	for _, p := range []string{dead, live} {
		for _, h := range hier {
			if err := os.MkdirAll(filepath.Join(h, p, "sb"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, h := range hier {
			_ = os.Remove(filepath.Join(h, live, "sb"))
			_ = os.Remove(filepath.Join(h, live))
		}
	})
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan error, 1)
	go func() { reaped <- sleeper.Wait() }()
	for _, h := range hier {
		if err := os.WriteFile(filepath.Join(h, dead, "sb", "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
			_ = sleeper.Process.Kill()
			t.Fatal(err)
		}
	}
	SweepDeadTests()
	select {
	case <-reaped:
	case <-time.After(10 * time.Second):
		_ = sleeper.Process.Kill()
		t.Error("the stale parent's process was not killed")
	}
	for _, h := range hier {
		if _, err := os.Stat(filepath.Join(h, dead)); err == nil {
			t.Errorf("%s survived the sweep", filepath.Join(h, dead))
		}
		if _, err := os.Stat(filepath.Join(h, live, "sb")); err != nil {
			t.Errorf("the live run's group %s was swept", filepath.Join(h, live, "sb"))
		}
	}
}
