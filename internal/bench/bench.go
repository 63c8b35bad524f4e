// Package bench is `dsec bench`: a load generator that measures a running
// DSec through its public API, as users see it: function call latency and
// throughput, create → run → delete cycles, and memory per idle sandbox.
// It prints a table (or JSON) of p50/p90/p99 and rates per scenario and
// concurrency level.
package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Result is one scenario at one concurrency.
type Result struct {
	Scenario    string  `json:"scenario"`
	Concurrency int     `json:"concurrency"`
	Ops         int     `json:"ops"`
	Errors      int     `json:"errors"`
	Seconds     float64 `json:"seconds"`
	Rate        float64 `json:"ops_per_s"`
	P50         float64 `json:"p50_ms"`
	P90         float64 `json:"p90_ms"`
	P99         float64 `json:"p99_ms"`
	// Note carries a scenario-specific figure (e.g. memory per sandbox).
	Note string `json:"note,omitempty"`
	// FirstError explains errors, if any.
	FirstError string `json:"first_error,omitempty"`
	// Counts are a scenario's counted outcomes (create-burst: the
	// server's answers by HTTP status, failed creates and commands).
	Counts map[string]int `json:"counts,omitempty"`
}

// op is one measured operation; worker-local setup happens in prepare.
type op func(ctx context.Context, worker int) error

// run drives fn from conc workers for d (after a warm-up of warm) and
// returns latency percentiles and the rate.
func run(ctx context.Context, name string, conc int, warm, d time.Duration, fn op) Result {
	var (
		mu       sync.Mutex
		lat      []time.Duration
		errs     atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	wctx, cancel := context.WithTimeout(ctx, warm)
	work := func(ctx context.Context, w int, record bool) {
		local := make([]time.Duration, 0, 4096)
		for ctx.Err() == nil {
			t := time.Now()
			err := fn(ctx, w)
			el := time.Since(t)
			if ctx.Err() != nil {
				break // an op cut short by the end of the phase is not a sample
			}
			if err != nil {
				errs.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				continue
			}
			if record {
				local = append(local, el)
			}
		}
		if record {
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}
	}
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); work(wctx, w, false) }()
	}
	wg.Wait()
	cancel()
	errs.Store(0)
	firstErr = atomic.Value{}

	mctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); work(mctx, w, true) }()
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lat)
	r := Result{Scenario: name, Concurrency: conc, Ops: len(lat), Errors: int(errs.Load()), Seconds: el.Seconds(),
		Rate: float64(len(lat)) / el.Seconds(), P50: pct(lat, 50), P90: pct(lat, 90), P99: pct(lat, 99)}
	if v, ok := firstErr.Load().(string); ok {
		r.FirstError = v
	}
	return r
}

// Check fails a run in which a measurement saw errors or completed
// nothing: its figures measure a broken system, and a bench that exits 0
// on them hides the breakage (make bench-smoke relies on it).
func Check(res []Result) error {
	var errs []error
	for _, r := range res {
		switch {
		case r.Errors > 0:
			errs = append(errs, fmt.Errorf("%s at concurrency %d: %d errors (first: %s)", r.Scenario, r.Concurrency, r.Errors, r.FirstError))
		case r.Ops == 0:
			errs = append(errs, fmt.Errorf("%s at concurrency %d: no operation completed", r.Scenario, r.Concurrency))
		}
	}
	return errors.Join(errs...)
}

func pct(sorted []time.Duration, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	i = min(max(i-1, 0), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Millisecond)
}

func (r Result) String() string {
	return fmt.Sprintf("%s c=%d %d ops %.0f/s p50 %.3f ms p99 %.3f ms", r.Scenario, r.Concurrency, r.Ops, r.Rate, r.P50, r.P99)
}
