package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func (a *app) auditCmd() *cobra.Command {
	var skip, limit int
	var rulesOnly, integrity, follow bool
	cmd := &cobra.Command{
		Use:   "audit ID",
		Short: "What the node's eBPF monitor saw in a sandbox: execs, watched system calls, their verdicts and the rules they hit",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if integrity {
				return a.printIntegrity(cmd, c, argv[0])
			}
			if follow {
				return a.followAudit(cmd, c, argv[0], skip, rulesOnly)
			}
			evs, err := c.AuditEvents(cmd.Context(), argv[0], skip, limit)
			if err != nil {
				return err
			}
			if rulesOnly {
				kept := evs[:0]
				for _, e := range evs {
					if e.Rule != "" {
						kept = append(kept, e)
					}
				}
				evs = kept
			}
			if a.json {
				return printJSON(cmd.OutOrStdout(), evs)
			}
			tw := newTable(cmd.OutOrStdout(), auditColumns...)
			for _, e := range evs {
				row(tw, auditRow(e)...)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&skip, "skip", 0, "events to skip")
	cmd.Flags().IntVar(&limit, "limit", 0, "most events to show (default: the server's, 1000)")
	cmd.Flags().BoolVar(&rulesOnly, "rules", false, "only events that hit a rule")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events as they happen, until the sandbox ends")
	cmd.Flags().BoolVar(&integrity, "integrity", false, "the sandbox's integrity report instead: phases, rules hit, refused actions")
	return cmd
}

var auditColumns = []string{"TIME", "PHASE", "PID", "COMM", "WHAT", "ARGUMENT", "RESULT", "VERDICT", "SEVERITY", "RULE"}

// auditRow is an event as a row of auditColumns.
func auditRow(e api.AuditEvent) []string {
	what, arg := e.Kind, e.Path
	if e.Syscall != "" {
		what = e.Syscall
	}
	if e.Target != "" {
		arg += " → " + e.Target
	}
	if len(e.Argv) > 0 {
		arg = strings.Join(e.Argv, " ")
	}
	if e.Addr != "" {
		arg = e.Addr
	}
	return []string{e.Time.Local().Format(time.TimeOnly + ".000"), e.Phase, strconv.Itoa(int(e.Pid)), e.Comm, what, arg,
		strconv.FormatInt(e.Result, 10), e.Verdict, e.Severity, e.Rule}
}

// followAudit prints sandbox id's events as they come (NDJSON with
// --json), until the sandbox has ended or the command is interrupted.
func (a *app) followAudit(cmd *cobra.Command, c *client.Client, id string, skip int, rulesOnly bool) error {
	w := cmd.OutOrStdout()
	enc := json.NewEncoder(w)
	tw := newTable(w, auditColumns...)
	return c.FollowAuditEvents(cmd.Context(), id, skip, func(e api.AuditEvent) error {
		if rulesOnly && e.Rule == "" {
			return nil
		}
		if a.json {
			return enc.Encode(e)
		}
		row(tw, auditRow(e)...)
		return tw.Flush()
	})
}

// printIntegrity prints sandbox id's integrity report.
func (a *app) printIntegrity(cmd *cobra.Command, c *client.Client, id string) error {
	r, err := c.Integrity(cmd.Context(), id)
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(cmd.OutOrStdout(), r)
	}
	w := cmd.OutOrStdout()
	phases := make([]string, len(r.Phases))
	for i, p := range r.Phases {
		phases[i] = p.Phase
	}
	verdict := "clean"
	if r.Suspicious {
		verdict = "SUSPICIOUS"
	}
	fmt.Fprintf(w, "%s: %s (monitored: %v, sealed grading: %v)\n", r.Sandbox, verdict, r.Monitored, r.SealedGrading)
	fmt.Fprintf(w, "phases: %s\nevents: %d, refused: %d\n", strings.Join(phases, " → "), r.Events, r.Denied)
	if len(r.Rules) == 0 {
		return nil
	}
	tw := newTable(w, "RULE", "SEVERITY", "COUNT", "FIRST")
	for _, rc := range r.Rules {
		row(tw, rc.Rule, rc.Severity, strconv.Itoa(rc.Count), rc.First.Local().Format(time.TimeOnly+".000"))
	}
	return tw.Flush()
}
