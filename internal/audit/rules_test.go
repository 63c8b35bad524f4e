package audit

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/monitor"
)

func TestDefaultRules(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	first := func(e monitor.Event) string {
		for i := range rules {
			if rules[i].Matches(e) {
				return rules[i].Name
			}
		}
		return ""
	}
	sys := func(name string, ret int64) monitor.Event {
		return monitor.Event{Kind: monitor.KindSyscall, Syscall: name, Ret: ret}
	}
	withPath := func(e monitor.Event, p string) monitor.Event { e.Path = p; return e }
	withAddr := func(e monitor.Event, a string) monitor.Event { e.Addr = netip.MustParseAddrPort(a); return e }
	withArg := func(e monitor.Event, a uint64) monitor.Event { e.Args[0] = a; return e }
	withArgs := func(e monitor.Event, a ...uint64) monitor.Event { copy(e.Args[:], a); return e }
	for _, tc := range []struct {
		e    monitor.Event
		want string
	}{
		{sys("mount", -1), "mount"},
		{sys("finit_module", -1), "kernel-module"},
		{sys("setuid", -1), "privilege-refused"},
		{sys("setuid", 0), ""}, // allowed: su in the sandbox
		{withArg(sys("socket", 3), 17), "raw-socket"},
		{withArg(sys("socket", 3), 2), ""},
		{withAddr(sys("connect", -111), "169.254.169.254:80"), "metadata-connect"},
		{withAddr(sys("connect", -111), "10.88.0.1:7878"), "private-connect"},
		{withAddr(sys("connect", 0), "203.0.113.7:443"), ""},
		{withPath(sys("openat", 3), "/workspace/repo/tests/test_api.py"), "test-tampering"},
		{withPath(sys("openat", 3), "conftest.py"), "test-tampering"},
		{withPath(sys("renameat2", 0), "/usr/lib/python3/dist-packages/evil.pth"), "python-startup-hook"},
		{withPath(sys("openat", 3), "/workspace/repo/src/api.py"), ""},
		// sed -i: a temporary file renamed over the test (its new name,
		// the Target, is the test); the control renames over a source.
		{monitor.Event{Kind: monitor.KindSyscall, Syscall: "rename", Path: "/workspace/pkg/sedX1b2c3", Target: "/workspace/pkg/calc_test.go"}, "test-tampering"},
		{monitor.Event{Kind: monitor.KindSyscall, Syscall: "rename", Path: "/workspace/pkg/sedX1b2c3", Target: "/workspace/pkg/calc.go"}, ""},
		{monitor.Event{Kind: monitor.KindSyscall, Syscall: "linkat", Path: "/tmp/evil", Target: "/workspace/tests/test_x.py"}, "test-tampering"},
		{withPath(sys("truncate", 0), "/workspace/tests/test_x.py"), "test-tampering"},
		{withPath(sys("openat", 3), "/workspace/web/src/add.test.js"), "test-tampering"},
		{withPath(sys("openat", 3), "/workspace/web/src/Add.spec.tsx"), "test-tampering"},
		{withPath(sys("openat", 3), "/workspace/web/src/__tests__/add.js"), "test-tampering"},
		{withPath(sys("openat", 3), "/workspace/app/src/test/java/AddTest.java"), "test-tampering"},
		{withPath(sys("openat", 3), "/workspace/web/src/add.js"), ""},
		{withPath(sys("openat", 3), "/workspace/app/src/main/java/Add.java"), ""},
		{withPath(sys("open", 3), "/workspace/conftest.py"), "test-tampering"},
		{withPath(monitor.Event{Kind: monitor.KindExec}, "/grader/run.sh"), "grader-path"},
		{withPath(monitor.Event{Kind: monitor.KindExec}, "/usr/bin/python3"), ""},
		{monitor.Event{Kind: monitor.KindExec, Path: "/usr/bin/git", Argv: []string{"git", "log", "--all", "--oneline"}}, "git-history"},
		{monitor.Event{Kind: monitor.KindExec, Path: "/usr/bin/git", Argv: []string{"git", "log", "-3"}}, ""},
		{monitor.Event{Kind: monitor.KindExec, Path: "/usr/bin/git", Argv: []string{"git", "log", "-S", "fix"}}, "git-history"},
		// The kernel surface.
		{sys("perf_event_open", -1), "perf-event"},
		{sys("bpf", -1), "bpf"},
		{sys("kcmp", -1), "ptrace"},
		{sys("userfaultfd", -1), "userfaultfd"},
		{sys("keyctl", -1), "keyring"},
		{sys("clock_adjtime", -1), "clock-change"},
		{sys("clock_adjtime", 0), ""}, // reading the clock
		{sys("personality", -1), "personality-refused"},
		{sys("personality", 0), ""},
		{sys("open_by_handle_at", -1), "open-by-handle"},
		{sys("iopl", -1), "host-admin"},
		{withPath(withArgs(sys("mknodat", -1), 0, 0, 0o20600), "/tmp/mem"), "device-node"},
		{withPath(withArgs(sys("mknodat", -1), 0, 0, 0o60600), "/tmp/sda"), "device-node"},
		{withPath(withArgs(sys("mknodat", 0), 0, 0, 0o10600), "/tmp/fifo"), ""},
		{withPath(withArgs(sys("mknod", 0), 0, 0o140755, 0), "/tmp/sock"), ""},
		{withPath(withArgs(sys("fchmodat", 0), 0, 0, 0o4755), "/tmp/sp"), "setuid-bit"},
		{withPath(withArgs(sys("chmod", 0), 0, 0o2755, 0), "/tmp/sp"), "setuid-bit"},
		{withPath(withArgs(sys("fchmodat", 0), 0, 0, 0o755), "/tmp/sp"), ""},
		{withPath(sys("setxattr", -1), "/tmp/capx"), "file-capability"},
		{sys("sched_setscheduler", -1), "scheduling-refused"},
		{sys("setpriority", -13), "scheduling-refused"},
		{sys("setpriority", 0), ""},
		{sys("prlimit64", -1), "rlimit-refused"},
		{sys("prlimit64", 0), ""}, // every Go program raises its soft limit
		{withArg(sys("kill", 0), 1), "signal-init"},
		{withArg(sys("kill", 0), ^uint64(0)), "signal-init"},
		{withArg(sys("kill", 0), 0xffffffff), "signal-init"}, // kill(-1) from a register zero-extended (busybox sh)
		{withArg(sys("kill", 0), 0x1_0000_0001), "signal-init"},
		{withArg(sys("kill", 0), 37), ""},
		{withArg(sys("socket", -1), 30), "socket-refused"},
		{withArg(sys("socket", -97), 30), ""}, // EAFNOSUPPORT: no such family here
		{withAddr(sys("connect", -111), "1.1.1.1:853"), "dns-over-tls"},
		{withAddr(sys("connect", -111), "1.1.1.1:443"), ""},
		{sys("memfd_create", 3), "memfd-create"},
		// Protected paths.
		{withPath(sys("openat", -30), "/sys/fs/cgroup/release_agent"), "release-agent"},
		{withPath(sys("openat", -13), "/proc/sys/kernel/core_pattern"), "sysctl-write"},
		{withPath(sys("openat", -30), "/sys/kernel/uevent_helper"), "sysfs-write"},
		{withPath(sys("openat", -13), "/proc/1/exe"), "process-tamper"},
		{withPath(sys("openat", -26), "/proc/self/exe"), "process-tamper"},
		{withPath(sys("openat", 3), "/proc/self/fd/1"), ""},
		{withPath(sys("openat", 3), "/opt/dsec/bin/dsec-guest"), "agent-tamper"},
		{withPath(sys("openat", 3), "/etc/ld.so.preload"), "persistence"},
		{withPath(sys("openat", 3), "/etc/sudoers.d/x"), "persistence"},
		{withPath(sys("openat", 3), "/root/.bashrc"), "persistence"},
		{withPath(sys("renameat2", 0), "/etc/cron.d/job"), "persistence"},
		{withPath(sys("openat", 3), "/etc/hostname"), ""},
		{withPath(sys("openat", 3), "/w/.github/workflows/ci.yml"), "test-tampering"},
		{withPath(sys("openat", 3), "/w/.pytest_cache/v/cache/lastfailed"), "test-results"},
		{withPath(sys("openat", 3), "/w/junit.xml"), "test-results"},
		{withPath(sys("openat", 3), "/usr/lib/python3/site-packages/numpy/__init__.py"), "dependency-tamper"},
		{withPath(sys("openat", 3), "/usr/lib/python3/site-packages/x.pth"), "python-startup-hook"},
		{withPath(monitor.Event{Kind: monitor.KindExec}, "/dev/shm/x"), "fileless-exec"},
		{withPath(monitor.Event{Kind: monitor.KindExec}, "/dev/fd/3"), "fileless-exec"},
		{withPath(sys("execve", -13), "/dev/shm/x"), "fileless-exec-refused"},
		{withPath(sys("openat", 3), "/dev/shm/x"), ""}, // shared memory, written
		{withPath(sys("openat", -28), "/tmp/i/12000"), "quota-exhausted"},
		{sys("fallocate", -28), "quota-exhausted"},
		{sys("inotify_init1", -24), "kernel-quota-exhausted"},
		{sys("inotify_add_watch", -28), "kernel-quota-exhausted"},
		{sys("mq_open", -24), "kernel-quota-exhausted"},
		{sys("inotify_add_watch", -2), ""}, // a missing path
		{sys("mq_open", -2), ""},           // no such queue
		{withPath(sys("openat", -30), "/etc/passwd"), "read-only-write"},
		{withPath(sys("openat", -2), "/etc/nope/x"), ""},
		// What the node reports.
		{monitor.Event{Kind: monitor.KindSandboxEnded, Detail: "agent_exited: killed by SIGKILL"}, "sandbox-ended"},
	} {
		if got := first(tc.e); got != tc.want {
			t.Errorf("%+v: rule %q, want %q", tc.e, got, tc.want)
		}
	}
}

// TestRuleData checks the rules as data: unique names, a description
// each, and references to entries the catalogue has; every rule that
// names system calls names calls the monitor reports (rules_amd64_test).
func TestRuleData(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Description == "" {
			t.Errorf("rule %s has no description", r.Name)
		}
	}
	for _, bad := range []string{"A0", "A65", "R18", "B1", "A", "A01", "A+1", "R-1"} {
		if validRef(bad) {
			t.Errorf("%q is taken for a catalogue entry", bad)
		}
	}
	for _, good := range []string{"A1", "A64", "R1", "R17"} {
		if !validRef(good) {
			t.Errorf("%q is refused", good)
		}
	}
	for name, doc := range map[string]string{
		"dup":  `[{"name": "x", "severity": "low"}, {"name": "x", "severity": "high"}]`,
		"refs": `[{"name": "x", "severity": "low", "refs": ["A99"]}]`,
	} {
		if _, err := parseRules([]byte(doc), name); err == nil {
			t.Errorf("rules %s parsed", doc)
		}
	}
}

func TestNodeRule(t *testing.T) {
	r := NodeRule([]netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("192.0.2.10/32")})
	for addr, want := range map[string]bool{"10.88.0.1:7878": true, "10.88.3.4:22": true, "192.0.2.10:4222": true, "192.0.2.11:80": false, "203.0.113.7:443": false} {
		e := monitor.Event{Kind: monitor.KindSyscall, Syscall: "connect", Addr: netip.MustParseAddrPort(addr)}
		if got := r.Matches(e); got != want {
			t.Errorf("%s: %v, want %v", addr, got, want)
		}
	}
}

func TestOperatorRules(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.json")
	os.WriteFile(file, []byte(`[{"name": "mount", "severity": "low", "match": {"syscalls": ["mount"]}},
		{"name": "curl", "severity": "medium", "match": {"kind": "exec", "paths": ["**/curl"]}}]`), 0o600)
	rules, err := LoadRules(file)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Rule{}
	for _, r := range rules {
		byName[r.Name] = r
	}
	if byName["mount"].Severity != "low" || byName["curl"].Severity != "medium" || byName["kernel-module"].Name == "" {
		t.Errorf("merged rules: %+v", byName)
	}
	for _, bad := range []string{`[{"name": "x", "severity": "dire"}]`, `[{"name": "x", "severity": "low", "match": {"cidrs": ["nope"]}}]`, `{`} {
		os.WriteFile(file, []byte(bad), 0o600)
		if _, err := LoadRules(file); err == nil {
			t.Errorf("rules %s loaded", bad)
		}
	}
}
