package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

// createBurst fires o.Burst creates at once, as an asyncio rollout loop
// that starts all its sandboxes together does, each followed by one
// command in the new sandbox (a sandbox that create reported running must
// answer it). The client retries what the server asks it to (429, and
// 503 with Retry-After); the server's own count of what it answered is
// read from its metrics before and after. Every sandbox made is deleted.
//
// Rate is creates that succeeded per second of the burst's wall time;
// the percentiles are of each create as the caller saw it, retries
// included.
func createBurst(ctx context.Context, c *client.Client, o Options) (Result, error) {
	n := o.Burst
	if n <= 0 {
		return Result{}, errors.New("create-burst needs --burst N > 0")
	}
	before, err := createStatuses(ctx, c)
	if err != nil {
		return Result{}, fmt.Errorf("reading the server's metrics: %w", err)
	}
	rss0 := rss(o.ServerPID)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	req := api.CreateSandboxRequest{Tier: o.BurstTier, Image: o.BurstImage, TimeoutS: createTTL,
		Labels: map[string]string{"dsec-bench": run}}
	var (
		wg                     sync.WaitGroup
		mu                     sync.Mutex
		lat                    []time.Duration
		ids                    []string
		createErr, execErr     atomic.Int64
		firstCreate, firstExec atomic.Value
		last                   atomic.Int64 // when the last create returned, ns since start
	)
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			sb, err := c.CreateSandbox(ctx, req)
			el := time.Since(t)
			for {
				prev := last.Load()
				now := int64(time.Since(start))
				if now <= prev || last.CompareAndSwap(prev, now) {
					break
				}
			}
			if err != nil {
				createErr.Add(1)
				firstCreate.CompareAndSwap(nil, err.Error())
				return
			}
			mu.Lock()
			lat = append(lat, el)
			ids = append(ids, sb.ID)
			mu.Unlock()
			res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("true exited %d: %s", res.ExitCode, res.Stderr)
			}
			if err != nil {
				execErr.Add(1)
				firstExec.CompareAndSwap(nil, fmt.Sprintf("%s: %v", sb.ID, err))
			}
		}()
	}
	wg.Wait()
	wall := time.Duration(last.Load())
	// The server's memory with every sandbox of the burst live (after
	// its allocations of the burst itself have had a moment to settle).
	var rss1 int64
	if o.ServerPID > 0 {
		time.Sleep(2 * time.Second)
		rss1 = rss(o.ServerPID)
	}
	deleteAll(c, ids, 32)
	after, err := createStatuses(ctx, c)
	if err != nil {
		return Result{}, fmt.Errorf("reading the server's metrics: %w", err)
	}
	slices.Sort(lat)
	r := Result{Scenario: CreateBurst, Concurrency: n, Ops: len(lat), Errors: int(createErr.Load() + execErr.Load()),
		Seconds: wall.Seconds(), Rate: float64(len(lat)) / wall.Seconds(),
		P50: pct(lat, 50), P90: pct(lat, 90), P99: pct(lat, 99), Counts: map[string]int{}}
	for code, v := range after {
		if d := v - before[code]; d > 0 {
			r.Counts["http_"+code] = d
		}
	}
	r.Counts["create_failed"] = int(createErr.Load())
	r.Counts["exec_failed"] = int(execErr.Load())
	var s5xx int
	for code, v := range r.Counts {
		if strings.HasPrefix(code, "http_5") && code != "http_503" {
			s5xx += v
		}
	}
	all := "yes"
	if len(lat) != n || execErr.Load() > 0 {
		all = "no"
	}
	r.Note = fmt.Sprintf("%d %s creates at once: %d running (all, after retries: %s), server answered 429 ×%d, 503 ×%d, other 5xx ×%d; a command right after create failed in %d",
		n, o.BurstTier, len(lat), all, r.Counts["http_429"], r.Counts["http_503"], s5xx, execErr.Load())
	if o.ServerPID > 0 && len(ids) > 0 {
		r.Note += fmt.Sprintf("; server RSS %+.1f KiB per live sandbox (%.0f → %.0f MiB)",
			float64(rss1-rss0)/float64(len(ids))/1024, float64(rss0)/(1<<20), float64(rss1)/(1<<20))
	}
	for _, v := range []*atomic.Value{&firstCreate, &firstExec} {
		if s, ok := v.Load().(string); ok && r.FirstError == "" {
			r.FirstError = s
		}
	}
	return r, nil
}

// deleteAll deletes ids, conc at a time.
func deleteAll(c *client.Client, ids []string, conc int) {
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = c.DeleteSandbox(context.Background(), id)
		}()
	}
	wg.Wait()
}

// createStatuses reads from the server's metrics how many creates it has
// answered with each HTTP status.
func createStatuses(ctx context.Context, c *client.Client) (map[string]int, error) {
	b, err := c.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return parseCreateStatuses(b), nil
}

// parseCreateStatuses picks the counts of POST /v1/sandboxes by status
// out of Prometheus's text format.
func parseCreateStatuses(b []byte) map[string]int {
	out := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		labels, ok := strings.CutPrefix(line, "dsec_api_request_seconds_count{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(labels, "} ")
		if !ok || !strings.Contains(labels, `method="POST"`) || !strings.Contains(labels, `route="/v1/sandboxes"`) {
			continue
		}
		_, code, ok := strings.Cut(labels, `code="`)
		if !ok {
			continue
		}
		code, _, _ = strings.Cut(code, `"`)
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err == nil {
			out[code] += int(v)
		}
	}
	return out
}
