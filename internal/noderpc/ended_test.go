package noderpc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestReportEnded: a node's report reaches the control plane's handler;
// one the handler fails is sent again until it is taken; with no control
// plane listening the report is retried until its context ends.
func TestReportEnded(t *testing.T) {
	nc, _ := testenv.NATS(t)
	c := NewClient(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	r := EndedReport{Node: "n1", ID: "sb-1", Tier: "container", Reason: "agent_exited: killed by SIGKILL", Time: time.Now().UTC()}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := ReportEnded(short, nc, r); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a report no control plane answers: %v, want the deadline", err)
	}

	var calls atomic.Int32
	got := make(chan EndedReport, 4)
	stop, err := c.ServeEnded(func(r EndedReport) error {
		if calls.Add(1) == 1 {
			return errdefs.New(errdefs.Unavailable, "contention", "busy")
		}
		got <- r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := ReportEnded(ctx, nc, r); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if g.Node != r.Node || g.ID != r.ID || g.Tier != r.Tier || g.Reason != r.Reason || !g.Time.Equal(r.Time) {
			t.Errorf("the control plane got %+v, want %+v", g, r)
		}
	default:
		t.Fatal("the handler never took the report")
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the handler was called %d times, want 2 (a failure, then the retry)", n)
	}
}
