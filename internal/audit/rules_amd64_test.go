//go:build linux

package audit

import (
	"slices"
	"testing"

	"github.com/dsec-dev/dsec/internal/monitor"
)

// TestRulesNameReportedSyscalls: a rule that names a call the monitor
// does not report would never match in the container tier.
func TestRulesNameReportedSyscalls(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	reported := monitor.SyscallNames()
	// The function tier's own calls (phase.go: its workspace's writes).
	reported = append(reported, "mkdirat", "linkat", "utimensat")
	for _, r := range rules {
		for _, s := range r.Match.Syscalls {
			if !slices.Contains(reported, s) {
				t.Errorf("rule %s names %s, which the monitor does not report", r.Name, s)
			}
		}
	}
}
