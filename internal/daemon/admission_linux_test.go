package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/auth"
	"github.com/dsec-dev/dsec/internal/config"
)

// TestCreateBurstAdmission fires far more container creates at once than
// the node admits (2 starting, 16 waiting at most 2 s). Without retries
// every answer is 201 or 429 overloaded with Retry-After, never a 5xx;
// with the client's retries all 300 run and answer a command; refused
// creates leave no record, and nothing is left once they are deleted.
func TestCreateBurstAdmission(t *testing.T) {
	u := startContainers(t, func(c *config.Config) {
		c.Node.MaxStarts = 2
		c.Node.StartQueue = 16
		c.Node.StartWaitS = 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := api.CreateSandboxRequest{Tier: api.TierContainer, TimeoutS: 600}
	// The image's first create mounts its layers: not part of the burst.
	first, err := u.c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.c.DeleteSandbox(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	// Without retries: what the server answers.
	var (
		mu      sync.Mutex
		sbs     []api.Sandbox
		refused int
		other   []string
	)
	burst(150, func() {
		sb, err := u.c.CreateSandbox(ctx, req)
		mu.Lock()
		defer mu.Unlock()
		var ce *client.Error
		switch {
		case err == nil:
			sbs = append(sbs, *sb)
		case errors.As(err, &ce) && ce.StatusCode == 429 && ce.Code == "overloaded" && ce.RetryAfter >= time.Second:
			refused++
		default:
			other = append(other, err.Error())
		}
	})
	t.Logf("150 creates at once without retries: %d created, %d refused (429 overloaded)", len(sbs), refused)
	if len(other) > 0 {
		t.Errorf("%d creates failed otherwise than 429 overloaded with Retry-After, first: %s", len(other), other[0])
	}
	if refused == 0 || len(sbs) == 0 {
		t.Errorf("%d created and %d refused: want both from a node that admits 18", len(sbs), refused)
	}
	deleteAll(t, u.c, sbs)

	// With retries (the client's defaults, more of them): every create
	// succeeds and its sandbox answers at once.
	tok, err := auth.Load(u.dir)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := client.New(u.info.APIURL, tok, client.WithRetry(100), client.WithRetryBudget(100*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.CloseIdleConnections()
	sbs, other = nil, nil
	start := time.Now()
	burst(300, func() {
		sb, err := rc.CreateSandbox(ctx, req)
		if err == nil {
			mu.Lock()
			sbs = append(sbs, *sb)
			mu.Unlock()
			var res *api.ExecResult
			res, err = rc.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("true exited %d", res.ExitCode)
			}
			if err != nil {
				err = fmt.Errorf("a command in %s, just created: %w", sb.ID, err)
			}
		}
		if err != nil {
			mu.Lock()
			other = append(other, err.Error())
			mu.Unlock()
		}
	})
	t.Logf("300 creates at once with retries: %d ran a command in %v", len(sbs)-len(other), time.Since(start))
	if len(other) > 0 || len(sbs) != 300 {
		t.Errorf("%d of 300 created, %d failures, first: %v", len(sbs), len(other), other[:min(len(other), 1)])
	}
	deleteAll(t, rc, sbs)

	// Refused creates left no record: every one listed was deleted.
	list, err := u.c.ListSandboxes(ctx, client.ListOptions{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.Sandboxes {
		if sb.State != api.StateStopped {
			t.Errorf("sandbox %s is %s (%s), want every record stopped", sb.ID, sb.State, sb.Reason)
		}
	}
	// And the node holds nothing but its warm pool.
	ents, err := os.ReadDir(filepath.Join(u.dir, "node", "container", "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "warm-") {
			t.Errorf("the node still holds sandbox %s", e.Name())
		}
	}
}

// burst runs fn n times at once and waits for all.
func burst(n int, fn func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn()
		}()
	}
	// bounded: every fn is an API call through a client with its own deadline
	wg.Wait()
}
