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
		{withPath(monitor.Event{Kind: monitor.KindExec}, "/grader/run.sh"), "grader-path"},
		{withPath(monitor.Event{Kind: monitor.KindExec}, "/usr/bin/python3"), ""},
		{monitor.Event{Kind: monitor.KindExec, Path: "/usr/bin/git", Argv: []string{"git", "log", "--all", "--oneline"}}, "git-history"},
		{monitor.Event{Kind: monitor.KindExec, Path: "/usr/bin/git", Argv: []string{"git", "log", "-3"}}, ""},
	} {
		if got := first(tc.e); got != tc.want {
			t.Errorf("%+v: rule %q, want %q", tc.e, got, tc.want)
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
