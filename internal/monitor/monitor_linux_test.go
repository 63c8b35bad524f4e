//go:build linux && amd64

package monitor

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// cgroup2 makes a cgroup2 group for the test (removed at its end) and
// returns its directory and id.
func cgroup2(t *testing.T, name string) (string, uint64) {
	t.Helper()
	root := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup"
	}
	dir := filepath.Join(root, fmt.Sprintf("dsec-montest-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("cgroup %s left", dir)
		}
	})
	id, err := sys.CgroupID(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, id
}

// runIn runs script with /bin/sh in the cgroup dir (held on stdin until it
// has been moved there) and waits for it.
func runIn(t *testing.T, dir, script string) {
	t.Helper()
	// The shell says it runs before it joins the group: the exec
	// tracepoint fires after exec has closed the descriptor exec.Cmd
	// waits on, so a shell moved in as soon as Start returns could still
	// be in its own exec, and be killed for it.
	cmd := exec.Command("/bin/sh", "-c", "echo; read x; "+script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the shell did not start: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("go\n"))
	in.Close()
	go io.Copy(io.Discard, out)
	_ = testenv.WaitCmd(t, cmd, time.Minute, "the traced shell")
}

// collect gathers events until quiet for 300 ms.
func collect(m *Monitor) []Event {
	var out []Event
	for {
		select {
		case e := <-m.Events():
			out = append(out, e)
		case <-time.After(300 * time.Millisecond):
			return out
		}
	}
}

// TestMonitor: a watched group's exec, connect, write and refused calls
// are reported with their results; the same in an unwatched group are not.
func TestMonitor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	m, err := Start(nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	watched, wid := cgroup2(t, "watched")
	other, _ := cgroup2(t, "other")
	if err := m.Watch(wid); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "written")
	// Refused as an unprivileged user: setuid to root and a bind mount.
	script := fmt.Sprintf(`/bin/true; : > %s; exec setpriv --reuid 65534 --regid 65534 --clear-groups /bin/sh -c 'mount --bind /tmp /mnt 2>/dev/null; exec /usr/bin/python3 -c "import socket; socket.socket().connect_ex((\"127.0.0.1\", 9))"'`, file)
	runIn(t, other, script) // the control: the same, unwatched
	before := time.Now()
	runIn(t, watched, script)
	after := time.Now()
	evs := collect(m)
	if len(evs) == 0 {
		t.Fatal("no events from the watched group")
	}
	var seen []string
	found := map[string]bool{}
	for _, e := range evs {
		if e.Cgroup != wid {
			t.Errorf("an event of another group: %+v", e)
		}
		// The kernel's time of the call, on the clock of time.Now.
		if e.Time.Before(before) || e.Time.After(after) {
			t.Errorf("event %s %s at %v, outside the run (%v to %v)", e.Kind, e.Syscall, e.Time, before, after)
		}
		switch {
		case e.Kind == KindExec && e.Path == "/bin/true" && len(e.Argv) == 1 && e.Argv[0] == "/bin/true":
			found["exec"] = true
		case e.Kind == KindExec && e.Path == "/usr/bin/setpriv" && strings.Join(e.Argv[:3], " ") == "setpriv --reuid 65534":
			found["exec argv"] = true
		case e.Syscall == "openat" && e.Path == file && e.Ret >= 0:
			found["write"] = true
		case e.Syscall == "mount" && e.Path == "/mnt" && e.Denied():
			found["mount denied"] = true
		case e.Syscall == "connect" && e.Addr.String() == "127.0.0.1:9" && e.Failed():
			found["connect"] = true
		}
		seen = append(seen, fmt.Sprintf("%s %s %q %v ret=%d", e.Kind, e.Syscall, e.Path, e.Addr, e.Ret))
	}
	for _, want := range []string{"exec", "exec argv", "write", "mount denied", "connect"} {
		if !found[want] {
			t.Errorf("no %s event; saw:\n%s", want, strings.Join(seen, "\n"))
		}
	}
	// Unwatched again, the group is not reported.
	if err := m.Unwatch(wid); err != nil {
		t.Fatal(err)
	}
	runIn(t, watched, "/bin/true")
	if evs := collect(m); len(evs) != 0 {
		t.Errorf("%d events after Unwatch", len(evs))
	}
	if n := m.Dropped(); n != 0 {
		t.Errorf("%d events dropped", n)
	}
}

// kernelDev is the s_dev of the file system at path.
func kernelDev(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	d := st.Dev
	return ((d>>8)&0xfff|(d>>32)&^uint64(0xfff))<<20 | d&0xff | (d>>12)&^uint64(0xff)
}

// TestRestrictExec: a restricted group runs the allowed programs (by
// path, through a symlink, any file of an allowed directory) and every
// other exec is killed before it runs, with a denied exec event; the
// same execs in an unrestricted group run (the control), and once
// unrestricted the group runs anything again.
func TestRestrictExec(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Start(nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	restricted, rid := cgroup2(t, "restricted")
	other, _ := cgroup2(t, "unrestricted")
	if err := m.Watch(rid); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	// A copy of an allowed program elsewhere, a symlink to an allowed
	// one, a program of an allowed directory, one of another directory,
	// and exec through /proc/self/fd of a disallowed one.
	script := fmt.Sprintf(`cp /usr/bin/true %[1]s/true; ln -s /usr/bin/true %[1]s/link
		/usr/bin/true && echo allowed >> %[2]s
		%[1]s/link && echo symlink >> %[2]s
		/usr/sbin/nologin >/dev/null; echo "dir $?" >> %[2]s
		%[1]s/true; echo "copy $?" >> %[2]s
		/usr/bin/env true; echo "env $?" >> %[2]s
		(exec 7<%[1]s/true; /usr/bin/env -i /proc/self/fd/7); echo "fd $?" >> %[2]s`, tmp, out)
	allow := []string{sh, "/usr/bin/true", "/usr/bin/cp", "/usr/bin/ln", "/usr/sbin/*"}
	if err := m.RestrictExec(rid, kernelDev(t, "/"), allow); err != nil {
		t.Fatal(err)
	}
	runIn(t, other, script)
	control, _ := os.ReadFile(out)
	if got, want := string(control), "allowed\nsymlink\ndir 1\ncopy 0\nenv 0\nfd 0\n"; got != want {
		t.Fatalf("negative control, unrestricted: %q, want %q", got, want)
	}
	os.Remove(out)
	os.Remove(filepath.Join(tmp, "true"))
	os.Remove(filepath.Join(tmp, "link"))
	runIn(t, restricted, script)
	got, _ := os.ReadFile(out)
	if want := "allowed\nsymlink\ndir 1\ncopy 137\nenv 137\nfd 137\n"; string(got) != want {
		t.Errorf("restricted: %q, want %q", got, want)
	}
	var denied []string
	for _, e := range collect(m) {
		if e.Kind == KindExec && e.Denied() {
			denied = append(denied, e.Path)
		}
	}
	if want := []string{tmp + "/true", "/usr/bin/env", "/usr/bin/env"}; strings.Join(denied, " ") != strings.Join(want, " ") {
		t.Errorf("denied exec events: %q, want %q", denied, want)
	}

	// "dir/**" allows every file below dir, at any depth, and nothing
	// beside it; "dir/*" only the files directly in dir.
	tree := filepath.Join(tmp, "tree")
	for _, d := range []string{"a/b/c", "flat/sub"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"top", "a/b/c/deep", "flat/direct", "flat/sub/nested"} {
		copyFile(t, "/usr/bin/true", filepath.Join(tree, p))
	}
	copyFile(t, "/usr/bin/true", filepath.Join(tmp, "tree-beside"))
	if err := m.RestrictExec(rid, kernelDev(t, "/"), []string{sh, tree + "/a/**", tree + "/flat/*"}); err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	runIn(t, restricted, fmt.Sprintf(`cd %s; for p in a/b/c/deep flat/direct flat/sub/nested top ../tree-beside; do ./$p; echo "$p $?" >> %s; done`, tree, out))
	if got, want := readString(t, out), "a/b/c/deep 0\nflat/direct 0\nflat/sub/nested 137\ntop 137\n../tree-beside 137\n"; got != want {
		t.Errorf("dir/** and dir/*: %q, want %q", got, want)
	}

	// A policy for another file system allows nothing.
	if err := m.RestrictExec(rid, kernelDev(t, "/")+1, allow); err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	runIn(t, restricted, "/usr/bin/true; echo $? > "+out)
	if got, _ := os.ReadFile(out); string(got) != "137\n" {
		t.Errorf("another file system: %q, want 137", got)
	}
	if err := m.UnrestrictExec(rid); err != nil {
		t.Fatal(err)
	}
	runIn(t, restricted, "/usr/bin/env true; echo $? > "+out)
	if got, _ := os.ReadFile(out); string(got) != "0\n" {
		t.Errorf("unrestricted again: %q, want 0", got)
	}
	m.xmu.Lock()
	n := len(m.allowed)
	m.xmu.Unlock()
	var k monitorExecKey
	var v uint8
	if n != 0 || m.objs.ExecAllowed.Iterate().Next(&k, &v) {
		t.Errorf("allowed paths left after UnrestrictExec")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMonitorPaths: relative paths are reported absolute (against the
// cwd, a directory fd, across a mount), a rename's and a link's new name
// is reported as the Target, and the write-and-rename of `sed -i` names
// the file it replaced.
func TestMonitorPaths(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	m, err := Start(nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer m.Close()
	dir, id := cgroup2(t, "paths")
	if err := m.Watch(id); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := os.Mkdir(filepath.Join(tmp, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "sub", "s_test.go"), []byte("assert\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// /dev/shm is a mount of its own: the path crosses it.
	shm, err := os.MkdirTemp("/dev/shm", "dsec-montest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	script := fmt.Sprintf(`cd %[1]s/sub && echo x > a && mv a b && ln b c && ln -s b d && sed -i s/assert/pass/ s_test.go &&
		cd .. && : > sub/../e &&
		/usr/bin/python3 -c "import os; fd = os.open('sub', os.O_RDONLY); os.close(os.open('f', os.O_CREAT | os.O_WRONLY, dir_fd=fd))" &&
		cd %[2]s && : > g && : > %[1]s/abs`, tmp, shm)
	runIn(t, dir, script)
	if b, _ := os.ReadFile(filepath.Join(tmp, "sub", "s_test.go")); string(b) != "pass\n" {
		t.Fatalf("the script did not run to its end: s_test.go is %q", b)
	}
	evs := collect(m)
	has := func(syscalls, path, target string) bool {
		for _, e := range evs {
			if strings.Contains(" "+syscalls+" ", " "+e.Syscall+" ") && e.Path == path && e.Target == target && e.Ret >= 0 {
				return true
			}
		}
		return false
	}
	sub := filepath.Join(tmp, "sub")
	for _, c := range []struct{ what, syscalls, path, target string }{
		{"a relative open", "openat open creat", sub + "/a", ""},
		{"a rename", "rename renameat renameat2", sub + "/a", sub + "/b"},
		{"a hard link", "link linkat", sub + "/b", sub + "/c"},
		{"a symlink", "symlink symlinkat", sub + "/d", ""},
		{"sed -i's rename over the file", "rename renameat renameat2", "", sub + "/s_test.go"},
		{"a path through ..", "openat open creat", tmp + "/e", ""},
		{"a directory fd", "openat", sub + "/f", ""},
		{"across a mount", "openat open creat", shm + "/g", ""},
		{"an absolute path (as given)", "openat open creat", tmp + "/abs", ""},
	} {
		if c.path == "" { // sed's temporary file has a random name
			found := false
			for _, e := range evs {
				found = found || strings.Contains(" "+c.syscalls+" ", " "+e.Syscall+" ") && strings.HasPrefix(e.Path, sub+"/") && e.Target == c.target
			}
			if !found {
				t.Errorf("%s: no event with target %s", c.what, c.target)
			}
			continue
		}
		if !has(c.syscalls, c.path, c.target) {
			t.Errorf("%s: no %s event of %s → %q", c.what, c.syscalls, c.path, c.target)
		}
	}
	if t.Failed() {
		for _, e := range evs {
			if e.Kind == KindSyscall {
				t.Logf("%s %q → %q ret=%d", e.Syscall, e.Path, e.Target, e.Ret)
			}
		}
	}
	if n := m.Dropped(); n != 0 {
		t.Errorf("%d events dropped", n)
	}
}
