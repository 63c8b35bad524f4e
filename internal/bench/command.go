package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
)

// Command is `dsec bench`.
func Command() *cobra.Command {
	var (
		o       Options
		dataDir string
		scen    string
		retries int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a running DSec through its API: call latency and rate, create cycles, idle memory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// --url, --token and --json are the dsec root's global flags.
			url, _ := cmd.Flags().GetString("url")
			tok, _ := cmd.Flags().GetString("token")
			asJSON, _ := cmd.Flags().GetBool("json")
			if url == "" {
				url = envOr("DSEC_URL", "http://127.0.0.1:7878")
			}
			if tok == "" {
				tok = os.Getenv("DSEC_TOKEN")
			}
			if tok == "" {
				t, err := auth.Load(dataDir)
				if err != nil {
					return fmt.Errorf("no token: pass --token or --data-dir: %w", err)
				}
				tok = t
			}
			opts := []client.Option{client.WithTimeout(2 * time.Minute)}
			if retries >= 0 {
				opts = append(opts, client.WithRetry(retries))
			}
			c, err := client.New(url, tok, opts...)
			if err != nil {
				return err
			}
			o.Scenarios = strings.Split(scen, ",")
			w := cmd.OutOrStdout()
			var progress func(Result)
			if !asJSON {
				fmt.Fprintf(cmd.ErrOrStderr(), "dsec bench against %s: %v at concurrency %v, %s each\n", url, o.Scenarios, o.Concurrency, o.Duration)
				progress = func(r Result) { fmt.Fprintln(cmd.ErrOrStderr(), "  ", r) }
			}
			res, err := Run(cmd.Context(), c, o, progress)
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				_ = enc.Encode(res)
			} else {
				PrintTable(w, res)
			}
			if err == nil {
				err = Check(res)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", envOr("DSEC_DATA_DIR", "/var/lib/dsec"), "data directory to read the token from")
	f.IntSliceVar(&o.Concurrency, "concurrency", []int{1, 8, 32}, "concurrency levels")
	f.DurationVar(&o.Duration, "duration", 5*time.Second, "measured time per scenario and level")
	f.DurationVar(&o.Warmup, "warmup", time.Second, "unmeasured warm-up before each measurement")
	f.IntVar(&o.IdleSandboxes, "idle-sandboxes", 1000, "sandboxes for the idle-memory scenario")
	f.IntVar(&o.ServerPID, "server-pid", 0, "PID of the dsec server, to measure its RSS")
	f.StringVar(&scen, "scenarios", strings.Join(AllScenarios, ","), "comma-separated scenarios (also: "+CreateBurst+")")
	f.IntVar(&o.Burst, "burst", 2000, "creates fired at once by "+CreateBurst)
	f.StringVar(&o.BurstTier, "burst-tier", "container", "tier of the sandboxes of "+CreateBurst)
	f.StringVar(&o.BurstImage, "burst-image", "", "image of the sandboxes of "+CreateBurst+" (default: the tier's)")
	f.IntVar(&retries, "retries", -1, "retries of a request the server asks to retry (429, 503 with Retry-After); -1: the client's default")
	return cmd
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// PrintTable prints results as an aligned table.
func PrintTable(w io.Writer, res []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tconc\tops\terrors\tops/s\tp50 ms\tp90 ms\tp99 ms\t")
	ms := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v)
	}
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t\n", r.Scenario, r.Concurrency, r.Ops, r.Errors, r.Rate, ms(r.P50), ms(r.P90), ms(r.P99))
	}
	tw.Flush()
	for _, r := range res {
		if r.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Scenario, r.Note)
		}
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s c=%d: first error: %s\n", r.Scenario, r.Concurrency, r.FirstError)
		}
	}
}
