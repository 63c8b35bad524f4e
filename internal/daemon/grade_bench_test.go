package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// BenchmarkGrade measures a sealed grading end to end through the API
// (fresh sandbox, files carried, phase change, grader run, report read,
// sandbox destroyed) against its baseline in the same run: the same
// grader run in place in the agent's sandbox, as a trainer without
// sealed grading would. Workspaces of 1 and 200 files (4 KiB each).
func BenchmarkGrade(b *testing.B) {
	u := startContainers(b)
	c := u.c
	ctx := context.Background()
	importGradeTests(b, c)
	for _, files := range []int{1, 200} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox"})
		if err != nil {
			b.Fatal(err)
		}
		script := fmt.Sprintf(`mkdir -p /workspace/tests /workspace/src && printf '%%s\n' '%s' > /workspace/solution.sh &&
			i=1; while [ $i -lt %d ]; do head -c 4096 /dev/urandom > /workspace/src/f$i; i=$((i+1)); done`, strings.TrimSpace(honestSolution), files)
		for name, body := range gradeTests {
			script += fmt.Sprintf(" && printf '%%s' '%s' > /workspace/%s", body, name)
		}
		if res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Command: script}); err != nil || res.ExitCode != 0 {
			b.Fatalf("preparing the workspace: %+v %v", res, err)
		}
		for _, mode := range []string{"in-place", "sealed"} {
			b.Run(fmt.Sprintf("%s/files=%d", mode, files), func(b *testing.B) {
				var lat []time.Duration
				for i := 0; i < b.N; i++ {
					start := time.Now()
					if mode == "sealed" {
						res, err := c.Grade(ctx, sb.ID, api.GradeRequest{TestsLayer: "tests/adder:v1", Cmd: gradeCmd})
						if err != nil || res.Verdict != api.VerdictPassed || res.Carried < files {
							b.Fatalf("grading: %+v %v", res, err)
						}
					} else {
						res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: gradeCmd})
						if err != nil || res.ExitCode != 0 {
							b.Fatalf("grading in place: %+v %v", res, err)
						}
					}
					lat = append(lat, time.Since(start))
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			})
		}
		c.DeleteSandbox(ctx, sb.ID)
	}
}
