package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPercentiles(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	if pct(lat, 50) != 50 || pct(lat, 99) != 99 || pct(lat, 90) != 90 {
		t.Errorf("p50 %v p90 %v p99 %v", pct(lat, 50), pct(lat, 90), pct(lat, 99))
	}
	if pct(nil, 50) != 0 {
		t.Error("empty input")
	}
}

func TestRunCountsOpsAndErrors(t *testing.T) {
	calls := 0
	r := run(context.Background(), "x", 1, 10*time.Millisecond, 50*time.Millisecond, func(ctx context.Context, w int) error {
		calls++
		time.Sleep(time.Millisecond)
		if calls%2 == 0 {
			return errors.New("even")
		}
		return nil
	})
	if r.Ops == 0 || r.Errors == 0 || r.Rate <= 0 || r.P50 < 1 || !strings.Contains(r.FirstError, "even") {
		t.Errorf("result %+v", r)
	}
	if r.Ops+r.Errors > calls {
		t.Errorf("counted %d+%d of %d calls", r.Ops, r.Errors, calls)
	}
}

func TestParseCreateStatuses(t *testing.T) {
	text := `# HELP dsec_api_request_seconds API request latency
dsec_api_request_seconds_bucket{code="201",method="POST",route="/v1/sandboxes",le="+Inf"} 7
dsec_api_request_seconds_count{code="201",method="POST",route="/v1/sandboxes"} 7
dsec_api_request_seconds_count{code="429",method="POST",route="/v1/sandboxes"} 3
dsec_api_request_seconds_count{code="200",method="GET",route="/v1/sandboxes"} 9
dsec_api_request_seconds_count{code="503",method="POST",route="/v1/sandboxes/{id}/exec"} 4
`
	got := parseCreateStatuses([]byte(text))
	if len(got) != 2 || got["201"] != 7 || got["429"] != 3 {
		t.Errorf("parsed %v, want 201: 7 and 429: 3 only", got)
	}
}

func TestCheck(t *testing.T) {
	ok := Result{Scenario: "call-tiny", Concurrency: 2, Ops: 10}
	if err := Check([]Result{ok}); err != nil {
		t.Errorf("a clean run: %v", err)
	}
	for _, bad := range []Result{
		{Scenario: "call-go", Concurrency: 2},
		{Scenario: "create-exec-delete", Concurrency: 8, Ops: 5, Errors: 1, FirstError: "boom"},
	} {
		err := Check([]Result{ok, bad})
		if err == nil || !strings.Contains(err.Error(), bad.Scenario) {
			t.Errorf("%+v: %v, want an error naming the scenario", bad, err)
		}
	}
}
