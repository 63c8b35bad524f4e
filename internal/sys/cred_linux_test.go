package sys

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWithThreadEUID checks that a user namespace cloned under
// WithThreadEUID is owned by the uid given, that the clone's uid map
// could still be written (the thread kept its capabilities), that only
// the calling thread changed, and that it is root again afterwards.
func TestWithThreadEUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a thread's uid needs root")
	}
	const owner = 4_242_424
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: owner, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: owner, Size: 1}},
	}
	var during, process string
	stuck, err := WithThreadEUID(owner, func() error {
		during = threadUID(t, "/proc/thread-self/status")
		process = threadUID(t, "/proc/self/status") // the main thread's
		return cmd.Start()
	})
	if stuck || err != nil {
		t.Fatalf("WithThreadEUID: stuck %v, %v", stuck, err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		// bounded: sleep ends at SIGKILL
		_ = cmd.Wait()
	}()
	if want := "0\t4242424\t0\t4242424"; during != want {
		t.Errorf("the thread's uids during fn: %q, want %q (real, effective, saved, fs)", during, want)
	}
	if process != "0\t0\t0\t0" && unix.Gettid() != unix.Getpid() {
		t.Errorf("the main thread's uids during fn: %q, want root's", process)
	}
	if got, err := UserNSOwner(cmd.Process.Pid); err != nil || got != owner {
		t.Errorf("the clone's user namespace is owned by %d (%v), want %d", got, err, owner)
	}
	if after := threadUID(t, "/proc/thread-self/status"); after != "0\t0\t0\t0" {
		t.Errorf("the thread's uids after: %q, want root's", after)
	}
	if caps := threadField(t, "/proc/thread-self/status", "CapEff:"); caps == "0000000000000000" {
		t.Errorf("the thread's effective capabilities after: %s", caps)
	}
	if d, _, _ := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE, 0, 0); d != 1 {
		t.Errorf("the process's dumpable flag after: %d, want 1", d)
	}
	// The clone runs sleep: its map was written.
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/uid_map"); err != nil || !strings.Contains(string(b), "4242424") {
		t.Errorf("the clone's uid map: %q, %v", b, err)
	}
}

func threadUID(t *testing.T, status string) string {
	return threadField(t, status, "Uid:")
}

func threadField(t *testing.T, status, key string) string {
	t.Helper()
	b, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("%s has no %s", status, key)
	return ""
}

// BenchmarkWithThreadEUID is what WithThreadEUID adds to each sandbox's
// fork: the uid's change and back, and the capabilities raised.
func BenchmarkWithThreadEUID(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("changing a thread's uid needs root")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		if stuck, err := WithThreadEUID(4_242_424, func() error { return nil }); stuck || err != nil {
			b.Fatal(stuck, err)
		}
	}
}
