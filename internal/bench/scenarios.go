package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

// Options select what to run.
type Options struct {
	Concurrency []int
	Duration    time.Duration
	Warmup      time.Duration
	// IdleSandboxes is how many sandboxes the memory scenario creates.
	IdleSandboxes int
	Scenarios     []string
	// ServerPID, if set, is the server process whose RSS is measured.
	ServerPID int
	// Burst is how many creates the create-burst scenario fires at once,
	// of BurstTier sandboxes from BurstImage (empty: the tier's default).
	Burst      int
	BurstTier  string
	BurstImage string
}

// Scenario names.
const (
	CallTiny = "call-tiny"
	CallGo   = "call-go"
	Cycle    = "create-exec-delete"
	IdleMem  = "idle-memory"
	// CreateBurst is opt-in (it needs the container tier and many
	// sandboxes): Burst creates at once (burst.go).
	CreateBurst = "create-burst"
	createTTL   = 600
)

// AllScenarios in the order they run. Idle memory goes first, on a server
// whose heap has not yet been grown by the load of the other scenarios.
var AllScenarios = []string{IdleMem, CallTiny, CallGo, Cycle}

// Run runs the selected scenarios against c and returns their results.
func Run(ctx context.Context, c *client.Client, o Options, progress func(Result)) ([]Result, error) {
	var out []Result
	emit := func(r Result) {
		out = append(out, r)
		if progress != nil {
			progress(r)
		}
	}
	for _, s := range o.Scenarios {
		switch s {
		case CallTiny, CallGo:
			tool := map[string]string{CallTiny: "tiny-echo", CallGo: "cat"}[s]
			sbs, err := createSandboxes(ctx, c, max(slicesMax(o.Concurrency), 1))
			if err != nil {
				return out, err
			}
			call := func(ctx context.Context, w int) error {
				res, err := c.Exec(ctx, sbs[w%len(sbs)], api.ExecRequest{Cmd: []string{tool}, Stdin: "ping"})
				if err == nil && (res.ExitCode != 0 || res.Stdout != "ping") {
					err = fmt.Errorf("%s: exit %d stdout %q stderr %q", tool, res.ExitCode, res.Stdout, res.Stderr)
				}
				return err
			}
			// The first call compiles the tool on a fresh node (seconds
			// for a Go program): made before the warm-up, however short.
			if err := call(ctx, 0); err != nil {
				deleteSandboxes(c, sbs)
				return out, fmt.Errorf("%s: first call: %w", s, err)
			}
			for _, conc := range o.Concurrency {
				emit(run(ctx, s, conc, o.Warmup, o.Duration, call))
			}
			deleteSandboxes(c, sbs)
		case Cycle:
			for _, conc := range o.Concurrency {
				emit(run(ctx, s, conc, o.Warmup, o.Duration, func(ctx context.Context, w int) error {
					sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutS: createTTL})
					if err != nil {
						return err
					}
					res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"tiny-echo"}, Stdin: "x"})
					// Delete even if the phase ends mid-cycle.
					derr := c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
					if err == nil && res.Stdout != "x" {
						err = fmt.Errorf("exec in a new sandbox: %+v", res)
					}
					return errors.Join(err, derr)
				}))
			}
		case CreateBurst:
			r, err := createBurst(ctx, c, o)
			if err != nil {
				return out, err
			}
			emit(r)
		case IdleMem:
			r, err := idleMemory(ctx, c, o)
			if err != nil {
				return out, err
			}
			emit(r)
		default:
			return out, fmt.Errorf("unknown scenario %q (have %v and %s)", s, AllScenarios, CreateBurst)
		}
	}
	return out, nil
}

func slicesMax(v []int) int {
	m := 0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func createSandboxes(ctx context.Context, c *client.Client, n int) ([]string, error) {
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutS: createTTL})
		if err != nil {
			deleteSandboxes(c, ids)
			return nil, err
		}
		ids = append(ids, sb.ID)
	}
	return ids, nil
}

func deleteSandboxes(c *client.Client, ids []string) {
	for _, id := range ids {
		_ = c.DeleteSandbox(context.Background(), id)
	}
}

// idleMemory creates IdleSandboxes sandboxes, each having run one call,
// and reports the growth of the server's RSS and of the host's used
// memory (which includes kernel objects such as each workspace's mount)
// per sandbox.
func idleMemory(ctx context.Context, c *client.Client, o Options) (Result, error) {
	n := o.IdleSandboxes
	settle := func() { time.Sleep(2 * time.Second) }
	settle()
	rss0, used0 := rss(o.ServerPID), hostUsed()
	start := time.Now()
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{TimeoutS: createTTL})
		if err != nil {
			deleteSandboxes(c, ids)
			return Result{}, err
		}
		ids = append(ids, sb.ID)
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"tiny-echo"}, Stdin: "x"}); err != nil {
			deleteSandboxes(c, ids)
			return Result{}, err
		}
	}
	el := time.Since(start)
	settle()
	rss1, used1 := rss(o.ServerPID), hostUsed()
	deleteSandboxes(c, ids)
	r := Result{Scenario: IdleMem, Concurrency: 1, Ops: n, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds()}
	perHost := float64(used1-used0) / float64(n) / 1024
	if o.ServerPID > 0 {
		perRSS := float64(rss1-rss0) / float64(n) / 1024
		r.Note = fmt.Sprintf("%d idle sandboxes: server RSS +%.1f KiB/sandbox, host used memory +%.1f KiB/sandbox", n, perRSS, perHost)
	} else {
		r.Note = fmt.Sprintf("%d idle sandboxes: host used memory +%.1f KiB/sandbox (give --server-pid for the server's RSS)", n, perHost)
	}
	return r, nil
}

// rss returns a process's resident set in bytes, or 0.
func rss(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	return procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS") * 1024
}

// hostUsed is MemTotal − MemAvailable in bytes.
func hostUsed() int64 {
	return (procField("/proc/meminfo", "MemTotal") - procField("/proc/meminfo", "MemAvailable")) * 1024
}

func procField(path, name string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == name {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}
