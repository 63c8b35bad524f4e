package daemon

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// TestContainerAuditEvents: what a container sandbox does reaches
// GET /v1/sandboxes/{id}/events through the node's eBPF monitor, with
// the rule each event hit and whether the call was refused; a benign
// command hits no rule.
func TestContainerAuditEvents(t *testing.T) {
	u := startContainers(t)
	c := u.c
	ctx := context.Background()
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].Monitor != "on" || nodes.Nodes[0].Guard != "on" {
		t.Fatalf("the node's monitor: %+v, %v", nodes, err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox",
		Phases: []api.Phase{{Name: "coding"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	mustExec(t, c, sb.ID, api.ExecRequest{Command: "echo fine > /tmp/notes.txt"})
	res := mustExec(t, c, sb.ID, api.ExecRequest{Command: "mount -t tmpfs none /mnt; mkdir -p /work/tests && echo 'def test(): pass' > /work/tests/test_x.py; echo done"})
	if res.Stdout != "done\n" {
		t.Fatalf("the probes: %+v", res)
	}
	// Reward hacks (catalogue R): a .pth startup hook, a conftest, git
	// history digging, a write where the grader lives.
	res = mustExec(t, c, sb.ID, api.ExecRequest{Command: `mkdir -p /usr/lib/python3/dist-packages /w /grader &&
		echo 'import os' > /usr/lib/python3/dist-packages/evil.pth && touch /w/conftest.py &&
		cp /bin/busybox /tmp/git && (PATH=/tmp:$PATH git log --all 2>/dev/null; true) && echo 1 > /grader/answer && echo done`})
	if res.Stdout != "done\n" {
		t.Fatalf("the reward hacks: %+v", res)
	}
	want := map[string]func(api.AuditEvent) bool{
		"mount denied": func(e api.AuditEvent) bool {
			return e.Rule == "mount" && e.Syscall == "mount" && e.Verdict == "denied" && e.Path == "/mnt" && e.Severity == "high"
		},
		"test file written": func(e api.AuditEvent) bool {
			return e.Rule == "test-tampering" && e.Syscall == "openat" && e.Verdict == "allowed" && e.Path == "/work/tests/test_x.py"
		},
		"exec of the shell": func(e api.AuditEvent) bool {
			return e.Kind == "exec" && e.Path == "/bin/sh" && e.Rule == "" && len(e.Argv) == 3 && e.Argv[1] == "-c"
		},
		"pth hook": func(e api.AuditEvent) bool {
			return e.Rule == "python-startup-hook" && e.Path == "/usr/lib/python3/dist-packages/evil.pth"
		},
		"conftest": func(e api.AuditEvent) bool { return e.Rule == "test-tampering" && e.Path == "/w/conftest.py" },
		"git history": func(e api.AuditEvent) bool {
			return e.Rule == "git-history" && e.Path == "/tmp/git" && slices.Contains(e.Argv, "--all")
		},
		"grader": func(e api.AuditEvent) bool {
			return e.Rule == "grader-path" && e.Path == "/grader/answer" && e.Severity == "critical"
		},
		"benign write": func(e api.AuditEvent) bool {
			return e.Syscall == "openat" && e.Path == "/tmp/notes.txt" && e.Rule == "" && e.Severity == "info"
		},
	}
	var evs []api.AuditEvent
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err = c.AuditEvents(ctx, sb.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		missing := []string{}
		for name, ok := range want {
			found := false
			for _, e := range evs {
				found = found || ok(e)
			}
			if !found {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events missing %v among %d:\n%s", missing, len(evs), dump(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, e := range evs {
		if e.Sandbox != sb.ID || e.Phase != "coding" || e.Pid == 0 {
			t.Errorf("event %+v", e)
		}
	}
	// The integrity report sums it up.
	rep, err := c.Integrity(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]int{}
	for _, r := range rep.Rules {
		rules[r.Rule] = r.Count
	}
	if !rep.Monitored || !rep.Suspicious || rep.Denied < 1 || rep.Events != len(evs) || rules["mount"] < 1 || rules["test-tampering"] != 2 ||
		rules["git-history"] != 1 || rules["grader-path"] != 1 || rep.BySeverity["critical"] != 1 ||
		rep.BySeverity["high"] < 2 || len(rep.Phases) != 1 || rep.Phases[0].Phase != "coding" || rep.SealedGrading {
		t.Errorf("integrity: %+v", rep)
	}
	// The control: a sandbox that does nothing suspicious.
	clean, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, clean.ID)
	mustExec(t, c, clean.ID, api.ExecRequest{Command: "echo fine > /tmp/notes.txt"})
	if rep, err := c.Integrity(ctx, clean.ID); err != nil || rep.Suspicious || len(rep.Rules) != 0 || !rep.Monitored {
		t.Errorf("integrity of a clean sandbox: %+v, %v", rep, err)
	}
	// The cgroup-bpf guard refuses a metadata connect with EPERM before
	// nftables sees a packet, even under an open policy; the monitor sees
	// the refusal.
	open, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox",
		Network: &api.NetworkPolicy{Egress: api.EgressOpen}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, open.ID)
	res = mustExec(t, c, open.ID, api.ExecRequest{Command: "nc -w 1 169.254.169.254 80 </dev/null 2>&1; nc -w 1 $(ip route | awk '/default/ {print $3}') 7878 </dev/null 2>&1; true"})
	deadline = time.Now().Add(10 * time.Second)
	for {
		oevs, err := c.AuditEvents(ctx, open.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		meta, node := false, false
		for _, e := range oevs {
			meta = meta || e.Syscall == "connect" && e.Addr == "169.254.169.254:80" && e.Result == -1 && e.Verdict == "denied" && e.Rule == "metadata-connect"
			node = node || e.Syscall == "connect" && strings.HasSuffix(e.Addr, ":7878") && e.Verdict != "allowed" && e.Rule == "node-connect" && e.Severity == "critical"
		}
		if meta && node {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refused metadata and node connects among (nc said %q):\n%s", res.Stdout, dump(oevs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Paging.
	if page, err := c.AuditEvents(ctx, sb.ID, 1, 2); err != nil || len(page) != 2 || !reflect.DeepEqual(page[0], evs[1]) {
		t.Errorf("skip 1 limit 2: %d events, %v", len(page), err)
	}
}

func dump(evs []api.AuditEvent) string {
	s := ""
	for _, e := range evs {
		s += fmt.Sprintf("  %s %s %q %s %d %s %s\n", e.Kind, e.Syscall, e.Path, e.Addr, e.Result, e.Verdict, e.Rule)
	}
	return s
}
